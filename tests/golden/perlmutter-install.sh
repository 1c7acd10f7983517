#!/bin/bash
# hpcstack 0.3.0: install pytorch/2.3.1-gpu for site perlmutter
# prefix: /global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu (published by the module step)
# stage prefix: /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@ (build @BUILD@)
# modulefile: /global/common/software/PROJECT/hpcstack/modulefiles/pytorch/2.3.1-gpu.lua
set -euo pipefail
cd /  # every command runs in a directory of root's, never the caller's
module load python
module load cudatoolkit/12.2
module load cray-mpich
module load nccl/2.21.5

# --- background: fetch and patch, one after the other, while venv and wheels run; step build waits for them
(
# --- step fetch: download sources and check their sha256
hpcstack action fetch --sha256 92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0 https://files.pythonhosted.org/packages/e4/86/da559fcc1620ac7831a16ccb2ad3acb477a8da8a631f75a83b6410507210/horovod-0.28.1.tar.gz /global/common/software/PROJECT/hpcstack/.hpcstack/cache/sources/horovod-0.28.1.tar.gz
# --- step patch: unpack sources into the stage dir and apply patches
echo '35e4a5310f71bbcb607a0ffac6c2d2a9a686786c084d5e564e1181de1552b59a  @HPCSTACK_DATA@/recipes/pytorch/patches/horovod-0.28.1-cxx17.patch' | sha256sum -c -
echo '782ef1c2a0e548168a21554d3aee56f470a61959ebb32b6016f6074d2ead5867  @HPCSTACK_DATA@/recipes/pytorch/patches/horovod-0.28.1-gcc13-cmake4.patch' | sha256sum -c -
echo 'a926ab2bc624972c8b652283a726ae49b95ed14031e93d52fb28f1c84c0290c1  @HPCSTACK_DATA@/recipes/pytorch/patches/horovod-0.28.1-cuda-runtime.patch' | sha256sum -c -
echo '8ea0d41f6cbdbf2bfcc41e768a915b419b1b3134858089c7db6ba345fdbf0acc  @HPCSTACK_DATA@/recipes/pytorch/patches/horovod-0.28.1-onerank-avg.patch' | sha256sum -c -
# no wheel of this version in the build cache: the build step will compile; unpack and
# patch now, while the wheels install, and leave the stamp the build step looks for
if ! ls /global/common/software/PROJECT/hpcstack/.hpcstack/cache/builds/horovod-0.28.1/*/*.whl >/dev/null 2>&1; then
  rm -f /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/src/.horovod-0.28.1.prepared
  hpcstack action unpack /global/common/software/PROJECT/hpcstack/.hpcstack/cache/sources/horovod-0.28.1.tar.gz /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/src
  (cd /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/src/horovod-0.28.1 && patch -p1 -i @HPCSTACK_DATA@/recipes/pytorch/patches/horovod-0.28.1-cxx17.patch)
  (cd /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/src/horovod-0.28.1 && patch -p1 -i @HPCSTACK_DATA@/recipes/pytorch/patches/horovod-0.28.1-gcc13-cmake4.patch)
  (cd /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/src/horovod-0.28.1 && patch -p1 -i @HPCSTACK_DATA@/recipes/pytorch/patches/horovod-0.28.1-cuda-runtime.patch)
  (cd /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/src/horovod-0.28.1 && patch -p1 -i @HPCSTACK_DATA@/recipes/pytorch/patches/horovod-0.28.1-onerank-avg.patch)
  echo 890b7353d14352618e93891878314dbad7754a5c4e9c4c0b1243f51cebf936dd > /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/src/.horovod-0.28.1.prepared
fi
# --- end of the background
) &
hpcstack_background=$!

# --- step venv: create the venv on top of the site's Python module
python3 -m venv --clear --without-pip /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv
mkdir -p /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv/lib/python3.11/site-packages
hpcstack_tmp=$(mktemp /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv/lib/python3.11/site-packages/.00-hpcstack-paths.pth.XXXXXX)
cat > "$hpcstack_tmp" <<'HPCSTACK_EOF'
# hpcstack: this stack's site-packages by its real path, after the standard library (fewer file-system calls per import, and the build a process started with)
import sys; sys.path[:] = [p for p in sys.path if p not in ('/global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu/venv/lib/python3.11/site-packages', '/global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv/lib/python3.11/site-packages')] + ['/global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv/lib/python3.11/site-packages']
HPCSTACK_EOF
chmod 644 "$hpcstack_tmp"
mv -fT "$hpcstack_tmp" /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv/lib/python3.11/site-packages/00-hpcstack-paths.pth

# --- step wheels: install the pinned wheels from the lock file in one resolution
env -u UV_CONFIG_FILE -u UV_INDEX -u UV_DEFAULT_INDEX -u UV_INDEX_URL -u UV_EXTRA_INDEX_URL -u UV_FIND_LINKS -u UV_NO_INDEX -u UV_INDEX_STRATEGY -u UV_TORCH_BACKEND -u UV_INSECURE_HOST -u UV_NO_VERIFY_HASHES -u UV_CONSTRAINT -u UV_OVERRIDE -u UV_BUILD_CONSTRAINT -u UV_EXCLUDE_NEWER -u UV_PRERELEASE -u UV_RESOLUTION -u UV_NO_BINARY -u UV_NO_BUILD -u UV_NO_BUILD_ISOLATION -u UV_SYSTEM_PYTHON -u UV_BREAK_SYSTEM_PACKAGES -u UV_NO_CACHE -u UV_COMPILE_BYTECODE PYC_INVALIDATION_MODE=UNCHECKED_HASH @UV@ pip install --python /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv/bin/python --no-config --cache-dir /global/common/software/PROJECT/hpcstack/.hpcstack/cache/uv --link-mode hardlink --compile-bytecode --require-hashes -r @HPCSTACK_DATA@/recipes/pytorch/2.3.1-gpu.pypi.lock
# before this script runs, hpcstack checks the GPU architectures of torch recorded in @HPCSTACK_DATA@/recipes/pytorch/2.3.1-gpu.pypi.gpu-archs.json against compute capabilities 80 (and says so where none is recorded)

# --- wait for the background: fetch and patch (a failure there stops the script here)
wait "$hpcstack_background"

# --- step build: build from source with the site's compilers and libraries
hpcstack_archs=$("${CUDA_HOME}/bin/nvcc" --list-gpu-arch)
for cc in 80; do
  grep -qx "compute_$cc" <<<"$hpcstack_archs" || { echo "${CUDA_HOME}/bin/nvcc does not compile for compute_$cc" >&2; exit 2; }
done
# the wheel cache: the key hashes everything that changes the horovod binary
hpcstack_build_key_horovod() {
  (
    set +eu -o pipefail
    export CC=cc
    export CXX=CC
    export MPICC=cc
    export MPICXX=CC
    export FC=ftn
    export MPIFC=ftn
    export HOROVOD_WITH_PYTORCH=1
    export HOROVOD_WITHOUT_TENSORFLOW=1
    export HOROVOD_WITHOUT_MXNET=1
    export HOROVOD_WITH_MPI=1
    export HOROVOD_WITH_GLOO=1
    export HOROVOD_CPU_OPERATIONS=MPI
    export HOROVOD_GPU=CUDA
    export HOROVOD_GPU_OPERATIONS=NCCL
    export HOROVOD_CUDA_HOME="${CUDA_HOME}"
    export HOROVOD_NCCL_HOME="${NCCL_DIR}"
    export HOROVOD_BUILD_CUDA_CC_LIST=80
    export MPICH_GPU_SUPPORT_ENABLED=0
    export MAKEFLAGS=-j8
    echo 'hpcstack build key v2'
    echo 'package horovod 0.28.1'
    echo 'sdist horovod-0.28.1.tar.gz sha256 92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0'
    echo 'patch horovod-0.28.1-cxx17.patch sha256 35e4a5310f71bbcb607a0ffac6c2d2a9a686786c084d5e564e1181de1552b59a'
    echo 'patch horovod-0.28.1-gcc13-cmake4.patch sha256 782ef1c2a0e548168a21554d3aee56f470a61959ebb32b6016f6074d2ead5867'
    echo 'patch horovod-0.28.1-cuda-runtime.patch sha256 a926ab2bc624972c8b652283a726ae49b95ed14031e93d52fb28f1c84c0290c1'
    echo 'patch horovod-0.28.1-onerank-avg.patch sha256 8ea0d41f6cbdbf2bfcc41e768a915b419b1b3134858089c7db6ba345fdbf0acc'
    echo '--- python'; { /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv/bin/python -c 'import importlib.metadata as m, sys, sysconfig; print(sys.version); print(sys.base_prefix, sysconfig.get_platform(), sys.implementation.cache_tag); print("abi", sysconfig.get_config_var("SOABI"), sysconfig.get_config_var("EXT_SUFFIX"), getattr(sys, "abiflags", "")); [print(p, m.version(p)) for p in ["torch"]]'; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- variables'; { env | LC_ALL=C grep -E '^(HOROVOD_[A-Z0-9_]*|CC|CXX|FC|MPICC|MPICXX|MPIFC|CFLAGS|CXXFLAGS|CPPFLAGS|FFLAGS|LDFLAGS|CUDA_HOME|CUDA_PATH|NCCL_HOME|MPI_HOME|NVCC_(APPEND|PREPEND)_FLAGS|MPICH_GPU_SUPPORT_ENABLED)=' | LC_ALL=C sort; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- C compiler'; { "${CC:-cc}" --version; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- C++ compiler'; { "${CXX:-c++}" --version; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- Fortran compiler'; { "${FC:-gfortran}" --version; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- MPI'; { mpi="${MPICC:-${CC:-mpicc}}"; if "$mpi" -showme:version >/dev/null 2>&1; then "$mpi" -showme; "$mpi" -showme:version; else "$mpi" -show; "$mpi" -v 2>&1 | sed -n 1p; fi; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- cmake'; { cmake --version; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- CUDA'; { "${CUDA_HOME}/bin/nvcc" --version; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- NCCL'; { grep -E "^#define NCCL_(MAJOR|MINOR|PATCH|SUFFIX)" "${NCCL_DIR}/include/nccl.h"; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
  )
}
hpcstack_build_key_horovod_key=$(hpcstack_build_key_horovod | sha256sum | cut -c1-24)
if hpcstack action reuse-wheel horovod /global/common/software/PROJECT/hpcstack/.hpcstack/cache/builds/horovod-0.28.1/"${hpcstack_build_key_horovod_key}" /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/dist; then
  echo "horovod: build key ${hpcstack_build_key_horovod_key}"
else
  if [ "$(cat /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/src/.horovod-0.28.1.prepared 2>/dev/null)" = 890b7353d14352618e93891878314dbad7754a5c4e9c4c0b1243f51cebf936dd ]; then
    rm -f /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/src/.horovod-0.28.1.prepared  # unpacked and patched by the patch step
  else
    hpcstack action unpack /global/common/software/PROJECT/hpcstack/.hpcstack/cache/sources/horovod-0.28.1.tar.gz /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/src
    (cd /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/src/horovod-0.28.1 && patch -p1 -i @HPCSTACK_DATA@/recipes/pytorch/patches/horovod-0.28.1-cxx17.patch)
    (cd /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/src/horovod-0.28.1 && patch -p1 -i @HPCSTACK_DATA@/recipes/pytorch/patches/horovod-0.28.1-gcc13-cmake4.patch)
    (cd /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/src/horovod-0.28.1 && patch -p1 -i @HPCSTACK_DATA@/recipes/pytorch/patches/horovod-0.28.1-cuda-runtime.patch)
    (cd /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/src/horovod-0.28.1 && patch -p1 -i @HPCSTACK_DATA@/recipes/pytorch/patches/horovod-0.28.1-onerank-avg.patch)
  fi
  rm -rf /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/dist
  env -u UV_CONFIG_FILE -u UV_INDEX -u UV_DEFAULT_INDEX -u UV_INDEX_URL -u UV_EXTRA_INDEX_URL -u UV_FIND_LINKS -u UV_NO_INDEX -u UV_INDEX_STRATEGY -u UV_TORCH_BACKEND -u UV_INSECURE_HOST -u UV_NO_VERIFY_HASHES -u UV_CONSTRAINT -u UV_OVERRIDE -u UV_BUILD_CONSTRAINT -u UV_EXCLUDE_NEWER -u UV_PRERELEASE -u UV_RESOLUTION -u UV_NO_BINARY -u UV_NO_BUILD -u UV_NO_BUILD_ISOLATION -u UV_SYSTEM_PYTHON -u UV_BREAK_SYSTEM_PACKAGES -u UV_NO_CACHE -u UV_COMPILE_BYTECODE CC=cc CXX=CC MPICC=cc MPICXX=CC FC=ftn MPIFC=ftn HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=MPI HOROVOD_GPU=CUDA HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="${CUDA_HOME}" HOROVOD_NCCL_HOME="${NCCL_DIR}" HOROVOD_BUILD_CUDA_CC_LIST=80 MPICH_GPU_SUPPORT_ENABLED=0 MAKEFLAGS=-j8 TMPDIR=/global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu @UV@ build --no-config --cache-dir /global/common/software/PROJECT/hpcstack/.hpcstack/cache/uv --python /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv/bin/python --no-build-isolation --wheel --out-dir /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/dist /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/src/horovod-0.28.1
  mkdir -p /global/common/software/PROJECT/hpcstack/.hpcstack/cache/builds/horovod-0.28.1 && tmp=$(mktemp -d /global/common/software/PROJECT/hpcstack/.hpcstack/cache/builds/horovod-0.28.1/.new-XXXXXX) && chmod 755 "$tmp" && cp /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/dist/*.whl "$tmp"/ \
    && (cd "$tmp" && sha256sum -- *.whl > SHA256SUMS && chmod 644 -- *.whl SHA256SUMS) \
    && hpcstack_build_key_horovod > "$tmp/key.txt" && { mv -T "$tmp" /global/common/software/PROJECT/hpcstack/.hpcstack/cache/builds/horovod-0.28.1/"${hpcstack_build_key_horovod_key}" 2>/dev/null || rm -rf "$tmp"; }
fi

# --- step install: install built packages and the stack's tools
env -u UV_CONFIG_FILE -u UV_INDEX -u UV_DEFAULT_INDEX -u UV_INDEX_URL -u UV_EXTRA_INDEX_URL -u UV_FIND_LINKS -u UV_NO_INDEX -u UV_INDEX_STRATEGY -u UV_TORCH_BACKEND -u UV_INSECURE_HOST -u UV_NO_VERIFY_HASHES -u UV_CONSTRAINT -u UV_OVERRIDE -u UV_BUILD_CONSTRAINT -u UV_EXCLUDE_NEWER -u UV_PRERELEASE -u UV_RESOLUTION -u UV_NO_BINARY -u UV_NO_BUILD -u UV_NO_BUILD_ISOLATION -u UV_SYSTEM_PYTHON -u UV_BREAK_SYSTEM_PACKAGES -u UV_NO_CACHE -u UV_COMPILE_BYTECODE PYC_INVALIDATION_MODE=UNCHECKED_HASH @UV@ pip install --python /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv/bin/python --no-config --cache-dir /global/common/software/PROJECT/hpcstack/.hpcstack/cache/uv --link-mode hardlink --compile-bytecode --reinstall-package horovod --no-deps --no-index --find-links /global/common/software/PROJECT/hpcstack/.hpcstack/stage/pytorch-2.3.1-gpu/dist horovod==0.28.1
mkdir -p /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/bin
hpcstack_tmp=$(mktemp /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/bin/.extend-venv-activate.XXXXXX)
cat > "$hpcstack_tmp" <<'HPCSTACK_EOF'
#!/global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv/bin/python
"""extend-venv-activate: make a Python venv load an hpcstack module when activated.

Rendered by hpcstack from scripts/extend-venv-activate.j2; edit the template, not this file.
Standalone on purpose (standard library only): the stack it ships with has no hpcstack installed.
Run it with --help for what it changes.
"""

MODULE_NAME = 'pytorch/2.3.1-gpu'
MODULE_INIT = {'bash': '/opt/cray/pe/lmod/lmod/init/bash', 'sh': '/opt/cray/pe/lmod/lmod/init/sh', 'zsh': '/opt/cray/pe/lmod/lmod/init/zsh', 'csh': '/opt/cray/pe/lmod/lmod/init/csh'}


import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

PROG = "extend-venv-activate"
FENCE_OPEN = "# >>> hpcstack {name} >>>"
FENCE_CLOSE = "# <<< hpcstack {name} <<<"
_FENCE_OPEN_RE = re.compile(r"^[ \t]*# >>> hpcstack (\S+) >>>[ \t]*$")
_FENCE_ANY_RE = re.compile(r"^[ \t]*# (>>>|<<<) hpcstack \S+ (>>>|<<<)[ \t]*$")
_TOKEN_RE = re.compile(r"@([A-Z_]+)@")

# Lines the venv's own scripts must contain around our blocks (CPython venv and virtualenv alike).
_PATH_SAVE_RE = re.compile(r"_OLD_VIRTUAL_PATH[= ]+\"?\$PATH\b")
_PATH_RESTORE_RE = re.compile(r"\bPATH[= ]+\"?\$\{?_OLD_VIRTUAL_PATH\b")


class PatchError(Exception):
    """An activation script cannot be extended or restored safely; nothing was written."""


# --------------------------------------------------------------------------------------------
# Shell code. @NAME@ tokens are replaced by values already quoted for the shell in question.
# State while a venv is active: ACTIVE (set), UNLOAD (module to unload on deactivate, if we
# loaded it), OLD_PYTHONPATH (set only if PYTHONPATH was set before activation).
# --------------------------------------------------------------------------------------------

_SH_LOAD = """\
# Added by extend-venv-activate: load the stack module and put this venv's
# site-packages first on PYTHONPATH; deactivate undoes both.
if ! command -v module >/dev/null 2>&1 ; then
    # no module function (dash, env -i, sbatch --export=NONE): initialise the module tool
    if [ -n "${ZSH_VERSION:-}" ] ; then
        _hpcstack_init=@INIT_ZSH@
    elif [ -n "${BASH_VERSION:-}" ] ; then
        _hpcstack_init=@INIT_BASH@
    else
        _hpcstack_init=@INIT_SH@
    fi
    if [ -n "$_hpcstack_init" ] && [ -r "$_hpcstack_init" ] ; then
        . "$_hpcstack_init"
    fi
    if ! command -v module >/dev/null 2>&1 ; then
        echo "activate: the 'module' command is missing and the init script '$_hpcstack_init'" \\
            "did not define it; cannot load" @MODULE@ "- venv not activated" >&2
        unset _hpcstack_init
        return 1
    fi
    unset _hpcstack_init
fi
_hpcstack_restore () {
    if [ -n "${_HPCSTACK_UNLOAD:-}" ] ; then
        module unload "$_HPCSTACK_UNLOAD"
    fi
    if [ -n "${_HPCSTACK_OLD_PYTHONPATH+x}" ] ; then
        PYTHONPATH="$_HPCSTACK_OLD_PYTHONPATH"
        export PYTHONPATH
    else
        unset PYTHONPATH
    fi
    unset _HPCSTACK_ACTIVE _HPCSTACK_UNLOAD _HPCSTACK_OLD_PYTHONPATH
    hash -r 2>/dev/null || true
}
if [ -n "${_HPCSTACK_ACTIVE:-}" ] ; then
    # sourced again without deactivate: undo the earlier activation first
    _hpcstack_restore
fi
_HPCSTACK_ACTIVE=1
if [ -n "${PYTHONPATH+x}" ] ; then
    _HPCSTACK_OLD_PYTHONPATH="$PYTHONPATH"
fi
if ! module is-loaded @MODULE@ ; then
    if ! module load @MODULE@ ; then
        echo "activate: 'module load'" @MODULE@ "failed - venv not activated" >&2
        _hpcstack_restore
        unset -f _hpcstack_restore
        return 1
    fi
    _HPCSTACK_UNLOAD=@MODULE@
fi
PYTHONPATH=@SITE@"${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
"""

_SH_UNLOAD = """\
if [ -n "${_HPCSTACK_ACTIVE:-}" ] ; then
    _hpcstack_restore
fi
unset -f _hpcstack_restore 2>/dev/null || true
"""

_FISH_LOAD = """\
# Added by extend-venv-activate: load the stack module and put this venv's
# site-packages first on PYTHONPATH; deactivate undoes both.
if not functions -q module
    # no module function yet: initialise the module tool
    set -l init @INIT_FISH@
    if test -n "$init"; and test -r "$init"
        source "$init"
    end
    if not functions -q module
        echo "activate.fish: the 'module' command is missing and the init script '$init'" \\
            "did not define it; cannot load" @MODULE@ "- venv not activated" >&2
        return 1
    end
end
function _hpcstack_restore
    if test -n "$_hpcstack_unload"
        module unload $_hpcstack_unload
    end
    if set -q _hpcstack_old_pythonpath
        set -gx PYTHONPATH $_hpcstack_old_pythonpath
    else
        set -e PYTHONPATH
    end
    set -e _hpcstack_active
    set -e _hpcstack_unload
    set -e _hpcstack_old_pythonpath
end
if set -q _hpcstack_active
    # sourced again without deactivate: undo the earlier activation first
    _hpcstack_restore
end
set -g _hpcstack_active 1
if set -q PYTHONPATH
    set -g _hpcstack_old_pythonpath $PYTHONPATH
end
if not module is-loaded @MODULE@
    if not module load @MODULE@
        echo "activate.fish: 'module load'" @MODULE@ "failed - venv not activated" >&2
        _hpcstack_restore
        functions -e _hpcstack_restore
        return 1
    end
    set -g _hpcstack_unload @MODULE@
end
if test -n "$PYTHONPATH"
    set -gx PYTHONPATH @SITE@ $PYTHONPATH
else
    set -gx PYTHONPATH @SITE@
end
"""

_FISH_UNLOAD = """\
if set -q _hpcstack_active
    _hpcstack_restore
end
functions -e _hpcstack_restore
"""

# csh has no functions and cannot return from a sourced file: the restore commands live in a
# variable that deactivate evals, and a failed load jumps to a label at the end of the file.
# `module` is a multi-command alias, so it is never put behind && or a one-line if: the unload
# is a command in _hpcstack_unload (empty when we did not load the module), run through eval.
_CSH_RESTORE = (
    'eval "$_hpcstack_unload"; '
    'if ($_hpcstack_pp_set) setenv PYTHONPATH "$_hpcstack_pp:q"; '
    "if (! $_hpcstack_pp_set) unsetenv PYTHONPATH; "
    "unset _hpcstack_unload _hpcstack_pp_set _hpcstack_pp _hpcstack_restore; rehash"
)

_CSH_LOAD = """\
# Added by extend-venv-activate: load the stack module and put this venv's
# site-packages first on PYTHONPATH; deactivate undoes both.
if ("`alias module`" == "") then
    # no module alias (env -i, a new csh): initialise the module tool
    set _hpcstack_init = @INIT_CSH@
    if ("$_hpcstack_init" != "") then
        if (-r "$_hpcstack_init") source "$_hpcstack_init"
    endif
    if ("`alias module`" == "") then
        echo "activate.csh: the 'module' command is missing and the init script" \\
            "'$_hpcstack_init' did not define it; cannot load" @MODULE@ \\
            "- venv not activated" > /dev/stderr
        unset _hpcstack_init
        goto _hpcstack_abort
    endif
    unset _hpcstack_init
endif
if ($?_hpcstack_restore) then
    # sourced again without deactivate: undo the earlier activation first
    eval "$_hpcstack_restore"
endif
set _hpcstack_restore = '@RESTORE@'
set _hpcstack_unload = ''
set _hpcstack_pp_set = 0
set _hpcstack_pp = ''
if ($?PYTHONPATH) then
    set _hpcstack_pp_set = 1
    set _hpcstack_pp = "$PYTHONPATH:q"
endif
module is-loaded @MODULE@
if ($status != 0) then
    module load @MODULE@
    if ($status != 0) then
        echo "activate.csh: 'module load'" @MODULE@ "failed - venv not activated" > /dev/stderr
        eval "$_hpcstack_restore"
        goto _hpcstack_abort
    endif
    set _hpcstack_unload = 'module unload '@MODULE@
endif
if ($?PYTHONPATH) then
    if ("$PYTHONPATH:q" != "") then
        setenv PYTHONPATH @SITE@":$PYTHONPATH:q"
    else
        setenv PYTHONPATH @SITE@
    endif
else
    setenv PYTHONPATH @SITE@
endif
"""

_CSH_ABORT_LABEL = """\
_hpcstack_abort:
"""

# Inserted into csh's deactivate (inside the alias, or in virtualenv's deactivate.csh).
_CSH_DEACTIVATE_CALL = ('test "\\!:*" != "nondestructive" && test $?_hpcstack_restore = 1 '
                        '&& eval "$_hpcstack_restore"; ')
_CSH_DEACTIVATE_FILE = """\
if ($?_hpcstack_restore) then
    eval "$_hpcstack_restore"
endif
"""
_CSH_SELF_DESTRUCT = 'test "\\!:*" != "nondestructive" && unalias deactivate'


# --------------------------------------------------------------------------------------------
# Where the blocks go
# --------------------------------------------------------------------------------------------

BlockMaker = Callable[[str, Mapping[str, str]], str]


def _from_template(template: str) -> BlockMaker:
    """Return a block maker that fills ``template``'s @TOKENS@ (the anchor line is not used)."""
    return lambda anchor_line, values: _TOKEN_RE.sub(lambda m: values[m.group(1)], template)


def _csh_alias_with_restore(anchor_line: str, values: Mapping[str, str]) -> str:
    """Redefine csh's one-line deactivate alias with the restore call before its self-destruct.

    The original alias line stays untouched above this block, so removing the block restores it.
    """
    cut = anchor_line.rindex(_CSH_SELF_DESTRUCT)
    return anchor_line[:cut] + _CSH_DEACTIVATE_CALL + anchor_line[cut:]


@dataclass(frozen=True)
class Insertion:
    """One fenced block: where it goes and the lines that must surround it.

    anchor: the line the block is placed next to; None means the end of the file.
    place: "after" or "before" the anchor line ("end" when anchor is None).
    what: the anchor described for error messages.
    make: builds the block text from the anchor line and the quoted values.
    indent: extra indentation of the block relative to the anchor line.
    needs_before: a line that must come at or before the anchor (e.g. deactivate restoring PATH).
    needs_after: a line that must come after the anchor (e.g. activate saving PATH).
    """

    anchor: "re.Pattern[str] | None"
    place: str
    what: str
    make: BlockMaker
    indent: str = ""
    needs_before: "tuple[re.Pattern[str], str] | None" = None
    needs_after: "tuple[re.Pattern[str], str] | None" = None


@dataclass(frozen=True)
class ScriptFile:
    """An activation script in VENV/bin and the blocks it receives."""

    name: str
    insertions: "tuple[Insertion, ...]"


@dataclass(frozen=True)
class Shell:
    """A shell family: how to quote for it and the venv layouts we know how to extend."""

    name: str
    main_file: str
    quote: Callable[[str], str]
    layouts: "tuple[tuple[ScriptFile, ...], ...]"


def quote_sh(value: str) -> str:
    """Quote ``value`` as one word for bash, zsh and POSIX sh."""
    return shlex.quote(value)


def quote_fish(value: str) -> str:
    """Quote ``value`` as one word for fish (single quotes; only \\ and ' are escaped)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def quote_csh(value: str) -> str:
    """Quote ``value`` as one word for csh/tcsh (single quotes; ' and ! spliced in escaped)."""
    return "'" + value.replace("'", "'\\''").replace("!", "'\\!'") + "'"


_DEACTIVATE_NONDESTRUCTIVE = re.compile(r"^deactivate nondestructive[ \t]*$")
_PATH_SAVED = (_PATH_SAVE_RE, "activate saving PATH (_OLD_VIRTUAL_PATH)")
_PATH_RESTORED = (_PATH_RESTORE_RE, "deactivate restoring PATH from _OLD_VIRTUAL_PATH")

POSIX = Shell(
    name="bash/zsh",
    main_file="activate",
    quote=quote_sh,
    layouts=((ScriptFile("activate", (
        Insertion(_DEACTIVATE_NONDESTRUCTIVE, "after", "the line 'deactivate nondestructive'",
                  _from_template(_SH_LOAD), needs_after=_PATH_SAVED),
        Insertion(re.compile(r'^[ \t]*if \[ (! "\$\{?1(:?-)?\}?" =|"\$\{?1(:?-)?\}?" !=) '
                             r'"?nondestructive"? \] ?; then[ \t]*$'),
                  "after", "deactivate's 'if [ ! \"${1:-}\" = \"nondestructive\" ] ; then' line",
                  _from_template(_SH_UNLOAD), indent="    ", needs_before=_PATH_RESTORED),
    )),),),
)

FISH = Shell(
    name="fish",
    main_file="activate.fish",
    quote=quote_fish,
    layouts=((ScriptFile("activate.fish", (
        Insertion(_DEACTIVATE_NONDESTRUCTIVE, "after", "the line 'deactivate nondestructive'",
                  _from_template(_FISH_LOAD), needs_after=_PATH_SAVED),
        Insertion(re.compile(r"""^[ \t]*if test "\$argv\[1\]" != """
                             r"""["']?nondestructive["']?[ \t]*$"""),
                  "after", "deactivate's 'if test \"$argv[1]\" != \"nondestructive\"' line",
                  _from_template(_FISH_UNLOAD), indent="    ", needs_before=_PATH_RESTORED),
    )),),),
)

_CSH_LOAD_INSERTION = Insertion(
    re.compile(r"^setenv VIRTUAL_ENV\b"), "before", "the line 'setenv VIRTUAL_ENV ...'",
    _from_template(_CSH_LOAD), needs_after=_PATH_SAVED)
_CSH_ABORT_INSERTION = Insertion(None, "end", "the end of the file",
                                 _from_template(_CSH_ABORT_LABEL))

CSH = Shell(
    name="csh",
    main_file="activate.csh",
    quote=quote_csh,
    layouts=(
        # CPython venv, virtualenv 20: deactivate is a one-line alias
        (ScriptFile("activate.csh", (
            Insertion(re.compile(r"^alias deactivate '.*"
                                 + re.escape(_CSH_SELF_DESTRUCT) + r".*'[ \t]*$"),
                      "after", "the one-line 'alias deactivate ...' definition",
                      _csh_alias_with_restore, needs_before=_PATH_RESTORED),
            _CSH_LOAD_INSERTION,
            _CSH_ABORT_INSERTION,
        )),),
        # virtualenv 21: deactivate sources deactivate.csh
        (ScriptFile("activate.csh", (_CSH_LOAD_INSERTION, _CSH_ABORT_INSERTION)),
         ScriptFile("deactivate.csh", (
             Insertion(re.compile(r"^unalias deactivate[ \t]*$"), "before",
                       "the line 'unalias deactivate'", _from_template(_CSH_DEACTIVATE_FILE),
                       needs_before=_PATH_RESTORED),
         ))),
    ),
)

SHELLS = {"sh": POSIX, "fish": FISH, "csh": CSH}
ALL_FILES = ("activate", "activate.fish", "activate.csh", "deactivate.csh")


# --------------------------------------------------------------------------------------------
# Text surgery (bytes in, bytes out; undecodable bytes survive via surrogateescape)
# --------------------------------------------------------------------------------------------

def strip_blocks(text: str, where: str) -> "tuple[str, list[str]]":
    """Remove every hpcstack fenced block from ``text``.

    Args:
        text (str): a script's content.
        where (str): the file's name, for error messages.

    Returns:
        tuple[str, list[str]]: the text without blocks, and the module names the blocks were for.

    Raises:
        PatchError: a fence is opened and not closed, or closed without being opened.
    """
    lines = text.splitlines(keepends=True)
    kept: "list[str]" = []
    names: "list[str]" = []
    i = 0
    while i < len(lines):
        opened = _FENCE_OPEN_RE.match(lines[i].rstrip("\r\n"))
        if opened is None:
            if _FENCE_ANY_RE.match(lines[i].rstrip("\r\n")):
                raise PatchError(f"{where}:{i + 1}: hpcstack block end without a start; "
                                 "fix or recreate the file by hand")
            kept.append(lines[i])
            i += 1
            continue
        name = opened.group(1)
        close = FENCE_CLOSE.format(name=name)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == close), None)
        if end is None:
            raise PatchError(f"{where}:{i + 1}: hpcstack block for {name} is not closed by "
                             f"'{close}'; fix or recreate the file by hand")
        names.append(name)
        i = end + 1
    return "".join(kept), names


def _find_anchor(lines: "list[str]", ins: Insertion, where: str) -> int:
    """Return the index of the one line matching ``ins.anchor``; raise PatchError otherwise."""
    hits = [i for i, line in enumerate(lines) if ins.anchor.search(line.rstrip("\r\n"))]
    if len(hits) != 1:
        problem = "cannot find" if not hits else f"found {len(hits)} lines like"
        raise PatchError(f"{where}: {problem} {ins.what}; this activation script's layout is "
                         "not one extend-venv-activate knows, so it was left unchanged")
    at = hits[0]
    checks = ((ins.needs_before, range(0, at + 1), "before"),
              (ins.needs_after, range(at + 1, len(lines)), "after"))
    for need, span, side in checks:
        if need is not None and not any(need[0].search(lines[k]) for k in span):
            raise PatchError(f"{where}: expected {need[1]} {side} {ins.what}; "
                             "layout not recognised, file left unchanged")
    return at


def _indent_block(body: str, indent: str, name: str) -> "list[str]":
    """Return the fenced block's lines, every line prefixed by ``indent``."""
    lines = [FENCE_OPEN.format(name=name)] + body.splitlines() + [FENCE_CLOSE.format(name=name)]
    return [(indent + line if line else line) + "\n" for line in lines]


def insert_blocks(text: str, spec: ScriptFile, values: Mapping[str, str], where: str) -> str:
    """Insert ``spec``'s fenced blocks into ``text`` (which must hold no hpcstack block).

    Args:
        text (str): the pristine script.
        spec (ScriptFile): the blocks and their anchors.
        values (Mapping[str, str]): @TOKEN@ values, already quoted for the file's shell.
        where (str): the file's name, for error messages.

    Returns:
        str: the extended script; strip_blocks() on it gives back ``text`` exactly.

    Raises:
        PatchError: an anchor or a required surrounding line is missing or ambiguous, or the
            block would follow a last line with no newline.
    """
    lines = text.splitlines(keepends=True)
    planned = []
    for ins in spec.insertions:
        if ins.anchor is None:
            at, anchor_line = len(lines), ""
        else:
            idx = _find_anchor(lines, ins, where)
            at = idx + 1 if ins.place == "after" else idx
            anchor_line = lines[idx].rstrip("\r\n")
        if at > 0 and not lines[at - 1].endswith("\n"):
            raise PatchError(f"{where}: the last line has no newline; add one and retry")
        lead = re.match(r"[ \t]*", anchor_line).group(0) + ins.indent
        planned.append((at, _indent_block(ins.make(anchor_line, values), lead, MODULE_NAME)))
    for at, block in sorted(planned, key=lambda p: p[0], reverse=True):
        lines[at:at] = block
    return "".join(lines)


# --------------------------------------------------------------------------------------------
# The venv's start-up file: its python searches the standard library first
# --------------------------------------------------------------------------------------------

#: Written into the venv's site-packages by extend, removed by --undo. Sorted first among the
#: .pth files there (site runs them in name order), so the others already see the new order.
PTH_NAME = "00-hpcstack-venv.pth"
PTH_MARK = "# hpcstack extend-venv-activate:"

# Activation puts the venv's site-packages first on PYTHONPATH, the stack module's entries after
# it, so that every Python of the session (the stack's own too: torchrun, horovodrun) sees the
# venv's packages, then the stack's. PYTHONPATH comes ahead of the standard library, though, and
# every standard import would first look there (+8 % file-system calls for `import torch`,
# docs/benchmarks.md). In the venv's own python this line, run by `site` at start-up, moves the
# run of PYTHONPATH entries that starts with the venv's site-packages to after the standard
# library, in the same order (so the venv's packages still win over the stack's), the others by
# their real path (as the stack's own python has its site-packages: no symbolic link for torch's
# realpath of every module to read). Nothing else moves; with the venv's site-packages not on
# PYTHONPATH (not activated: deactivate took it off, or python -I/-E) it changes nothing.
# One line, Python 3.6 and later; names: p sys.path, v the venv's site-packages, s the standard
# library's directory, k where the standard library starts (its .zip entry, if any), i where
# the run starts (k when it is not ahead of the standard library), b the run.
_PTH_LINE = ("import os, sys; p = sys.path; v = {site}; s = os.path.dirname(os.__file__); "
             "k = p.index(s) if s in p else 0; k -= k > 0 and p[k - 1].endswith('.zip'); "
             "i = p.index(v) if v in p[:k] else k; b = p[i:k]; del p[i:k]; "
             "p += b[:1] + [os.path.realpath(x) if os.path.isabs(x) else x for x in b[1:]]\n")


def pth_text(site: str) -> str:
    """The venv's start-up file for the site-packages ``site`` (see _PTH_LINE): a comment line
    and one ``import`` line. ``site`` goes in as an ASCII Python literal (ascii()), whatever the
    bytes of its name or the locale that reads the file."""
    return (f"{PTH_MARK} this venv's python searches the standard library before the stack's\n"
            f"# and this venv's packages (which stay in that order); see `{PROG} --help`\n"
            + _PTH_LINE.format(site=ascii(site)))


def _is_ours(path: Path) -> bool:
    """Whether ``path`` is a start-up file this tool wrote (its first line is PTH_MARK ...)."""
    try:
        with open(path, "rb") as handle:
            return handle.readline().startswith(PTH_MARK.encode())
    except OSError:
        return False


def _owner_problem(path: Path) -> "str | None":
    """The owner of ``path`` (and of where it leads) when neither root nor the running account."""
    import pwd

    for stat in (os.lstat, os.stat):
        try:
            uid = stat(path).st_uid
        except OSError:
            continue
        if uid not in (0, os.geteuid()):
            try:
                return pwd.getpwuid(uid).pw_name
            except KeyError:
                return str(uid)
    return None


# --------------------------------------------------------------------------------------------
# The venv
# --------------------------------------------------------------------------------------------

def venv_site_packages(venv: Path) -> str:
    """Ask the venv's own interpreter for its site-packages directory (sysconfig purelib).

    Raises:
        PatchError: the interpreter is missing, fails, or prints something unusable.
    """
    python = venv / "bin" / "python"
    if not os.access(python, os.X_OK):
        raise PatchError(f"{python} not found or not executable; is {venv} a venv?")
    # -I -S: nothing of the working directory, the environment or the venv's .pth files runs;
    # without site, the venv's purelib is sysconfig's for the venv's own prefix
    code = ("import os, sys, sysconfig\n"
            "venv = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))\n"
            "scheme = 'venv' if 'venv' in sysconfig.get_scheme_names() else 'posix_prefix'\n"
            "print(sysconfig.get_path('purelib', scheme, {'base': venv, 'platbase': venv}))")
    try:
        out = subprocess.run([str(python), "-I", "-S", "-c", code], check=True, capture_output=True,
                             text=True, errors="surrogateescape", cwd="/").stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        raise PatchError(f"{python} could not report its site-packages: {detail}") from exc
    site = out.rstrip("\n")
    if not site.startswith("/") or "\n" in site or ":" in site:
        raise PatchError(f"{python} reported an unusable site-packages path: {site!r}")
    return site


def foreign_owner(venv: Path) -> "str | None":
    """Who else could change the venv: the owner of the venv (its directory, ``bin/`` or
    ``bin/python``) when that is neither the running account nor root, or an account that can
    change a directory above it (owns it, or may write it: group- or world-writable without the
    sticky bit), along the path as named and as resolved; None when only root and the running
    account can. The directories above count when root runs it (a user extending their own venv
    in a group's project directory is not refused).

    Extending a venv runs its python and rewrites files in a directory its owner controls: run by
    root (or anyone else) on another user's venv, that user's code would run as the caller. A
    directory above it that another account controls decides, by a link or a rename, which venv
    the path names from one moment to the next (the same rule as ``hpcstack doctor --venv``).

    Returns:
        str | None: e.g. ``"alice"`` or ``"alice (owner of /home/alice, above it)"``.
    """
    import pwd
    import stat

    def name(uid: int) -> str:
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return str(uid)

    mine = (0, os.geteuid())
    for path in (venv, venv / "bin", venv / "bin" / "python"):
        try:
            uid = os.lstat(path).st_uid
        except OSError:
            continue
        if uid not in mine:
            return name(uid)
    if os.geteuid() != 0:   # a user on their own venv in a shared project directory: theirs to judge
        return None
    chain = []
    for start in (Path(os.path.abspath(venv)), Path(os.path.realpath(venv))):
        for above in (start, *start.parents):
            if above not in chain:
                chain.append(above)
    for above in chain:
        try:
            st = os.lstat(above)
        except OSError:
            continue
        if st.st_uid not in mine:
            return f"{name(st.st_uid)} (owner of {above}, on the path to it)"
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_mode & stat.S_ISVTX:
            continue
        if st.st_mode & 0o002:
            return f"every user's ({above}, on the path to it, is writable by every user)"
        if st.st_mode & 0o020 and st.st_gid != 0 and st.st_gid != os.getegid():
            import grp
            try:
                group = grp.getgrgid(st.st_gid).gr_name
            except KeyError:
                group = str(st.st_gid)
            return f"group {group}'s ({above}, on the path to it, is writable by group {group})"
    return None


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", "surrogateescape")


def _write(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text``, keeping its permission bits (a new file: 0644)."""
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8", "surrogateescape"))
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _values(shell: Shell, site: str) -> "dict[str, str]":
    """The @TOKEN@ values for ``shell``, each quoted for it."""
    values = {"MODULE": shell.quote(MODULE_NAME), "SITE": shell.quote(site),
              "RESTORE": _CSH_RESTORE}
    for key in ("bash", "zsh", "sh", "fish", "csh"):
        values[f"INIT_{key.upper()}"] = shell.quote(MODULE_INIT.get(key, ""))
    return values


def _plan_shell(bindir: Path, shell: Shell, site: str) -> "dict[Path, str]":
    """New contents of ``shell``'s files, from the first layout that fits."""
    errors = []
    for layout in shell.layouts:
        try:
            plan = {}
            for spec in layout:
                path = bindir / spec.name
                if not path.is_file():
                    raise PatchError(f"{path}: missing")
                pristine, _ = strip_blocks(_read(path), str(path))
                plan[path] = insert_blocks(pristine, spec, _values(shell, site), str(path))
            return plan
        except PatchError as exc:
            errors.append(str(exc))
    hint = "" if shell is POSIX else f"\n(--shell lets you leave {shell.name} out)"
    raise PatchError("\n".join(dict.fromkeys(errors)) + hint)


def extend(venv: Path, shells: "list[str] | None" = None) -> "list[Path]":
    """Extend the venv's activation scripts; all or nothing.

    Args:
        venv (Path): the virtual environment's directory.
        shells (list[str] | None): keys of SHELLS to extend; None means every shell whose main
            script exists (bash/zsh's ``activate`` is then required).

    Besides the scripts, writes the venv's start-up file (PTH_NAME, see _PTH_LINE) into its
    site-packages, whichever shells are chosen.

    Returns:
        list[Path]: the files whose content changed (empty when already extended).

    Raises:
        PatchError: not a venv, its python fails, its site-packages is missing or another
            account's, or a script's layout is not recognised; no file has been written then.
    """
    bindir = venv / "bin"
    if not (bindir / "activate").is_file():
        raise PatchError(f"{bindir / 'activate'} not found; is {venv} a venv?")
    chosen = shells or [key for key, sh in SHELLS.items() if (bindir / sh.main_file).is_file()]
    site = venv_site_packages(venv)
    if not os.path.isdir(site):
        raise PatchError(f"{venv}'s python names {site} as its site-packages, which is not a directory")
    owner = _owner_problem(Path(site))
    if owner:
        raise PatchError(f"{site} is {owner}'s: writing {PTH_NAME} there would put a file into a "
                         f"directory that {owner} controls")
    plan: "dict[Path, str]" = {Path(site, PTH_NAME): pth_text(site)}
    for key in chosen:
        plan.update(_plan_shell(bindir, SHELLS[key], site))
    changed = [path for path, text in plan.items() if not path.is_file() or _read(path) != text]
    for path in changed:
        _write(path, plan[path])
    return changed


def undo(venv: Path) -> "list[Path]":
    """Remove every hpcstack block from the venv's activation scripts, restoring them exactly,
    and the venv's start-up file (PTH_NAME in ``lib/python*/site-packages``, if this tool wrote it).

    Returns:
        list[Path]: the files that changed or were removed (empty when nothing was extended).

    Raises:
        PatchError: a block is damaged (unclosed fence); no file has been written then.
    """
    bindir = venv / "bin"
    plan = {}
    for name in ALL_FILES:
        path = bindir / name
        if path.is_file():
            text = _read(path)
            pristine, names = strip_blocks(text, str(path))
            if names:
                plan[path] = pristine
    # found without running the venv's python, which may be gone (its base Python removed)
    startup = [p for p in sorted(venv.glob(f"lib/python*/site-packages/{PTH_NAME}"))
               if not p.is_symlink() and _is_ours(p)]
    for path, text in plan.items():
        _write(path, text)
    for path in startup:
        path.unlink()
    return list(plan) + startup


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

_INIT_LINES = "\n".join(f"  {shell}: {path}" for shell, path in sorted(MODULE_INIT.items())) or "  (none)"

DESCRIPTION = f"""\
Make a Python virtual environment use the {MODULE_NAME} module.

After `{PROG} VENV`, `source VENV/bin/activate`:
  - makes sure the `module` command exists: if the shell has none (dash, `env -i`,
    `sbatch --export=NONE`) it sources the site's init script; if that fails it prints
    an error and returns non-zero instead of activating;
  - loads {MODULE_NAME} unless it is already loaded, after `deactivate nondestructive`
    and before the venv puts its bin/ first on PATH, so `python` is the venv's;
  - puts the venv's site-packages (recorded now, from the venv's own python) first on
    PYTHONPATH, so packages you pip-install into the venv win over the stack's copies.
`deactivate` then restores PATH, unloads {MODULE_NAME} only if activation loaded it,
and restores PYTHONPATH exactly (unset stays unset, empty stays empty).

The venv's own python searches the standard library first, then the venv's packages,
then the stack's: a start-up file in its site-packages, {PTH_NAME}, moves the
PYTHONPATH entries from the venv's site-packages on to after the standard library,
in their order (the stack's by their real path), so that no standard import looks
through them first. It does so only while the venv's site-packages is on PYTHONPATH
(the venv active); otherwise, deactivated, the venv's python is a plain venv's. Other
Pythons of the session (the stack's own, e.g. torchrun) see PYTHONPATH as it is.

In a job of `sbatch --export=NONE` the activation works as above, and srun's tasks
get its environment too: Slurm passes SLURM_EXPORT_ENV=NONE on to srun, which would
start every task with an empty environment (`execve(): python: No such file or
directory`), so loading {MODULE_NAME} turns it into ALL.

Install packages into the venv with its own pip (`pip install PKG` once it is
active). A venv without pip (`uv venv` without --seed) is flagged: give it one
(`python -m ensurepip --default-pip` with it active) or use `uv pip install`.
"""

EPILOG = f"""\
What it changes: VENV/bin/activate (bash, zsh, POSIX sh), activate.fish and
activate.csh (and virtualenv's deactivate.csh), by inserting blocks fenced by
  {FENCE_OPEN.format(name=MODULE_NAME)}
  {FENCE_CLOSE.format(name=MODULE_NAME)}
and the venv's site-packages, by adding {PTH_NAME}.
Running it again is harmless (same bytes); running another stack's tool replaces
the blocks with its own. --undo removes the blocks, giving back the files byte for
byte, and the start-up file. If a script does not look as expected, nothing is changed and the exit
status is 1; --shell limits which shells are extended.

Supported: venvs made by `python -m venv` (3.6 to 3.13) and virtualenv (20, 21), before
or after the module was loaded; shells bash, zsh, dash/POSIX sh, fish, csh/tcsh; module
tools Environment Modules (4.x, 5.x) and Lmod (8.x). Under csh a failed module load
prints an error and skips the rest of activation, but `source` cannot report a failure
status. Under Lmod a PATH with duplicate entries comes back without them after
deactivate (Lmod removes duplicates from the paths it changes).

Module tool init scripts (sourced when `module` is missing):
{_INIT_LINES}

Examples:
  {PROG} ~/myvenv && source ~/myvenv/bin/activate
  {PROG} --undo ~/myvenv
"""


def main(argv: "list[str] | None" = None) -> int:
    """Command-line entry point; returns the exit status (0 ok, 1 refused, 2 usage or another account's venv)."""
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("venv", type=Path, help="the virtual environment's directory")
    parser.add_argument("--undo", action="store_true",
                        help="remove the extension, restoring the original scripts exactly")
    parser.add_argument("--shell", action="append", choices=sorted(SHELLS), dest="shells",
                        help="extend only this shell's script (repeatable; default: every "
                             "script present; 'sh' means bin/activate for bash/zsh/sh)")
    args = parser.parse_args(argv)
    venv = Path(os.path.abspath(args.venv))
    owner = foreign_owner(venv)
    if owner:
        print(f"{PROG}: error: {venv} is {owner}'s: extending it would run its python as you "
              f"and rewrite files that {owner} controls; let {owner} run {PROG} on it", file=sys.stderr)
        return 2
    try:
        changed = undo(venv) if args.undo else extend(venv, args.shells)
    except PatchError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    verb = "restored" if args.undo else "extended"
    for path in changed:
        print(f"{PROG}: {'removed' if not path.exists() else verb} {path}")
    mine = "%d.%d" % sys.version_info[:2]
    versions = sorted({p.parent.name[len("python"):] for p in venv.glob("lib/python*.*/site-packages")})
    if not args.undo and versions and mine not in versions:
        # this tool runs on the stack's python: a venv of another version cannot load its builds
        print(f"{PROG}: warning: {venv} is a Python {', '.join(versions)} venv and {MODULE_NAME} "
              f"is built for Python {mine}: its compiled packages will not import there; make the "
              f"venv with the stack's python (`module load {MODULE_NAME}`, then `python -m venv DIR`)",
              file=sys.stderr)
    if not changed:
        print(f"{PROG}: nothing to do in {venv}")
    if not args.undo and not (venv / "bin" / "pip").exists():
        print(f"{PROG}: warning: {venv} has no pip of its own (made by `uv venv` without --seed?): "
              f"`pip` there would be another one, which does not install into it; run "
              f"`{venv}/bin/python -m ensurepip --default-pip`, or install with `uv pip install`", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
HPCSTACK_EOF
chmod 755 "$hpcstack_tmp"
mv -fT "$hpcstack_tmp" /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/bin/extend-venv-activate
mkdir -p /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/bin
hpcstack_tmp=$(mktemp /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/bin/.pip.XXXXXX)
cat > "$hpcstack_tmp" <<'HPCSTACK_EOF'
#!/bin/sh
# pip of a stack's module, written by hpcstack. The stack is read-only and the module hides
# ~/.local (PYTHONNOUSERSITE=1), so `pip install` and `pip install --user` on top of it could not
# give a package its python imports. Packages go into a venv of your own extended for the module
# (extend-venv-activate); that venv's pip comes first on PATH once it is active, and this one says
# in one line (on stderr, exit status 1) what to do instead.
module=pytorch/2.3.1-gpu
fence='# >>> hpcstack pytorch/2.3.1-gpu >>>'
venv=${VIRTUAL_ENV:-}
if [ -z "$venv" ]; then
    echo "pip: $module takes no packages (read-only; ~/.local is hidden from it): make a venv: python -m venv ~/myvenv && extend-venv-activate ~/myvenv && source ~/myvenv/bin/activate && pip install ... ('module help $module')" >&2
elif [ ! -x "$venv/bin/pip" ]; then
    if grep -qF -e "$fence" "$venv/bin/activate" 2>/dev/null; then then_extend=""; else then_extend=", then extend it: extend-venv-activate $venv"; fi
    echo "pip: the active venv $venv has no pip (made by 'uv venv' without --seed?): run 'python -m ensurepip --default-pip' with it active, or use 'uv pip install'$then_extend" >&2
else
    echo "pip: the active venv $venv is not extended for $module, so python is the stack's and would not import what the venv's pip installs: module unload $module; deactivate; module load $module; extend-venv-activate $venv; source $venv/bin/activate" >&2
fi
exit 1
HPCSTACK_EOF
chmod 755 "$hpcstack_tmp"
mv -fT "$hpcstack_tmp" /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/bin/pip
ln -sfn pip /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/bin/pip3
ln -sfn pip /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/bin/pip3.11
rm -rf /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv/share/jupyter/kernels
rm -rf /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/examples/digits
mkdir -p /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/examples
cp -r @HPCSTACK_DATA@/examples/digits /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/examples/digits
rm -rf /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/lib/hpcstack-train
install -d -m 0755 /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/lib/hpcstack-train/hpcstack_train
install -m 0644 @HPCSTACK_DATA@/trainer/hpcstack_train/__init__.py @HPCSTACK_DATA@/trainer/hpcstack_train/__main__.py @HPCSTACK_DATA@/trainer/hpcstack_train/backends.py @HPCSTACK_DATA@/trainer/hpcstack_train/cli.py @HPCSTACK_DATA@/trainer/hpcstack_train/collective_cases.py @HPCSTACK_DATA@/trainer/hpcstack_train/collectives.py @HPCSTACK_DATA@/trainer/hpcstack_train/data.py @HPCSTACK_DATA@/trainer/hpcstack_train/errors.py @HPCSTACK_DATA@/trainer/hpcstack_train/launch.py @HPCSTACK_DATA@/trainer/hpcstack_train/models.py @HPCSTACK_DATA@/trainer/hpcstack_train/phases.py @HPCSTACK_DATA@/trainer/hpcstack_train/report.py @HPCSTACK_DATA@/trainer/hpcstack_train/timing.py /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/lib/hpcstack-train/hpcstack_train
install -D -m 0755 @HPCSTACK_DATA@/trainer/hpcstack-train-benchmark /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/bin/hpcstack-train-benchmark
mkdir -p /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/.hpcstack
hpcstack_tmp=$(mktemp /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/.hpcstack/.constraints.txt.XXXXXX)
cat > "$hpcstack_tmp" <<'HPCSTACK_EOF'
# Constraints of the stack pytorch/2.3.1-gpu: every package it holds, at its version.
# Set as PIP_CONSTRAINT and UV_CONSTRAINT by its module (hpcstack), so that a pip
# or uv install next to the stack cannot bring another version of them.
absl-py==2.1.0
appnope==0.1.4 ; sys_platform == 'darwin'
asttokens==2.4.1
certifi==2024.7.4
cffi==1.16.0
charset-normalizer==3.3.2
cloudpickle==3.0.0
colorama==0.4.6 ; sys_platform == 'win32'
comm==0.2.2
debugpy==1.8.2
decorator==5.1.1
exceptiongroup==1.2.2 ; python_full_version < '3.11'
executing==2.0.1
filelock==3.15.4
fsspec==2024.6.1
grpcio==1.65.2
gviz-api==1.10.0
idna==3.7
intel-openmp==2021.4.0 ; sys_platform == 'win32'
ipykernel==6.29.5
ipython==8.26.0
jedi==0.19.1
jinja2==3.1.4
joblib==1.4.2
jupyter-client==8.6.2
jupyter-core==5.7.2
lightning-utilities==0.11.6
markdown==3.6
markupsafe==2.1.5
matplotlib-inline==0.1.7
mkl==2021.4.0 ; sys_platform == 'win32'
mpmath==1.3.0
nest-asyncio==1.6.0
networkx==3.3
numpy==1.26.4
nvidia-cublas-cu12==12.1.3.1 ; platform_machine == 'x86_64' and sys_platform == 'linux'
nvidia-cuda-cupti-cu12==12.1.105 ; platform_machine == 'x86_64' and sys_platform == 'linux'
nvidia-cuda-nvrtc-cu12==12.1.105 ; platform_machine == 'x86_64' and sys_platform == 'linux'
nvidia-cuda-runtime-cu12==12.1.105 ; platform_machine == 'x86_64' and sys_platform == 'linux'
nvidia-cudnn-cu12==8.9.2.26 ; platform_machine == 'x86_64' and sys_platform == 'linux'
nvidia-cufft-cu12==11.0.2.54 ; platform_machine == 'x86_64' and sys_platform == 'linux'
nvidia-curand-cu12==10.3.2.106 ; platform_machine == 'x86_64' and sys_platform == 'linux'
nvidia-cusolver-cu12==11.4.5.107 ; platform_machine == 'x86_64' and sys_platform == 'linux'
nvidia-cusparse-cu12==12.1.0.106 ; platform_machine == 'x86_64' and sys_platform == 'linux'
nvidia-nccl-cu12==2.20.5 ; platform_machine == 'x86_64' and sys_platform == 'linux'
nvidia-nvjitlink-cu12==12.6.20 ; platform_machine == 'x86_64' and sys_platform == 'linux'
nvidia-nvtx-cu12==12.1.105 ; platform_machine == 'x86_64' and sys_platform == 'linux'
packaging==24.1
pandas==2.2.2
parso==0.8.4
pexpect==4.9.0 ; sys_platform != 'emscripten' and sys_platform != 'win32'
pillow==10.4.0
platformdirs==4.2.2
prompt-toolkit==3.0.47
protobuf==4.25.4
psutil==6.0.0
ptyprocess==0.7.0 ; sys_platform != 'emscripten' and sys_platform != 'win32'
pure-eval==0.2.3
pycparser==2.22
pygments==2.18.0
python-dateutil==2.9.0.post0
pytz==2024.1
pywin32==306 ; platform_python_implementation != 'PyPy' and sys_platform == 'win32'
pyyaml==6.0.1
pyzmq==26.0.3
requests==2.32.3
scikit-learn==1.5.1
scipy==1.14.0
setuptools==72.1.0
six==1.16.0
stack-data==0.6.3
sympy==1.13.1
tbb==2021.13.0 ; sys_platform == 'win32'
tensorboard==2.17.0
tensorboard-data-server==0.7.2
tensorboard-plugin-profile==2.15.2
tensorboard-plugin-wit==1.8.1
threadpoolctl==3.5.0
torch==2.3.1
torch-tb-profiler==0.4.3
torchaudio==2.3.1
torchmetrics==1.0.3
torchtext==0.18.0
torchvision==0.18.1
tornado==6.4.1
tqdm==4.66.4
traitlets==5.14.3
triton==2.3.1 ; python_full_version < '3.12' and platform_machine == 'x86_64' and sys_platform == 'linux'
typing-extensions==4.12.2
tzdata==2024.1
urllib3==2.2.2
wcwidth==0.2.13
werkzeug==3.0.3
wheel==0.43.0
horovod==0.28.1
HPCSTACK_EOF
chmod 644 "$hpcstack_tmp"
mv -fT "$hpcstack_tmp" /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/.hpcstack/constraints.txt
hpcstack action sbom --spec '{"builds": [{"env": {"CC": "cc", "CXX": "CC", "FC": "ftn", "HOROVOD_BUILD_CUDA_CC_LIST": "80", "HOROVOD_CPU_OPERATIONS": "MPI", "HOROVOD_CUDA_HOME": "${CUDA_HOME}", "HOROVOD_GPU": "CUDA", "HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_NCCL_HOME": "${NCCL_DIR}", "HOROVOD_WITHOUT_MXNET": "1", "HOROVOD_WITHOUT_TENSORFLOW": "1", "HOROVOD_WITH_GLOO": "1", "HOROVOD_WITH_MPI": "1", "HOROVOD_WITH_PYTORCH": "1", "MPICC": "cc", "MPICH_GPU_SUPPORT_ENABLED": "0", "MPICXX": "CC", "MPIFC": "ftn"}, "package": "horovod", "patches": [{"file": "@HPCSTACK_DATA@/recipes/pytorch/patches/horovod-0.28.1-cxx17.patch", "sha256": "35e4a5310f71bbcb607a0ffac6c2d2a9a686786c084d5e564e1181de1552b59a"}, {"file": "@HPCSTACK_DATA@/recipes/pytorch/patches/horovod-0.28.1-gcc13-cmake4.patch", "sha256": "782ef1c2a0e548168a21554d3aee56f470a61959ebb32b6016f6074d2ead5867"}, {"file": "@HPCSTACK_DATA@/recipes/pytorch/patches/horovod-0.28.1-cuda-runtime.patch", "sha256": "a926ab2bc624972c8b652283a726ae49b95ed14031e93d52fb28f1c84c0290c1"}, {"file": "@HPCSTACK_DATA@/recipes/pytorch/patches/horovod-0.28.1-onerank-avg.patch", "sha256": "8ea0d41f6cbdbf2bfcc41e768a915b419b1b3134858089c7db6ba345fdbf0acc"}], "probes": [["python", "/global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv/bin/python -c '"'"'import importlib.metadata as m, sys, sysconfig; print(sys.version); print(sys.base_prefix, sysconfig.get_platform(), sys.implementation.cache_tag); print(\"abi\", sysconfig.get_config_var(\"SOABI\"), sysconfig.get_config_var(\"EXT_SUFFIX\"), getattr(sys, \"abiflags\", \"\")); [print(p, m.version(p)) for p in [\"torch\"]]'"'"'"], ["variables", "env | LC_ALL=C grep -E '"'"'^(HOROVOD_[A-Z0-9_]*|CC|CXX|FC|MPICC|MPICXX|MPIFC|CFLAGS|CXXFLAGS|CPPFLAGS|FFLAGS|LDFLAGS|CUDA_HOME|CUDA_PATH|NCCL_HOME|MPI_HOME|NVCC_(APPEND|PREPEND)_FLAGS|MPICH_GPU_SUPPORT_ENABLED)='"'"' | LC_ALL=C sort"], ["C compiler", "\"${CC:-cc}\" --version"], ["C++ compiler", "\"${CXX:-c++}\" --version"], ["Fortran compiler", "\"${FC:-gfortran}\" --version"], ["MPI", "mpi=\"${MPICC:-${CC:-mpicc}}\"; if \"$mpi\" -showme:version >/dev/null 2>&1; then \"$mpi\" -showme; \"$mpi\" -showme:version; else \"$mpi\" -show; \"$mpi\" -v 2>&1 | sed -n 1p; fi"], ["cmake", "cmake --version"], ["CUDA", "\"${CUDA_HOME}/bin/nvcc\" --version"], ["NCCL", "grep -E \"^#define NCCL_(MAJOR|MINOR|PATCH|SUFFIX)\" \"${NCCL_DIR}/include/nccl.h\""]], "sha256": "92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0", "url": "https://files.pythonhosted.org/packages/e4/86/da559fcc1620ac7831a16ccb2ad3acb477a8da8a631f75a83b6410507210/horovod-0.28.1.tar.gz", "version": "0.28.1"}], "description": "PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1 and TensorBoard", "lock": "@HPCSTACK_DATA@/recipes/pytorch/2.3.1-gpu.pypi.lock", "name": "pytorch", "prefix": "/global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu", "site": "perlmutter", "site_packages": "/global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv/lib/python3.11/site-packages", "version": "2.3.1-gpu"}' /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/.hpcstack/sbom.cdx.json
install -D -m 0755 @HPCSTACK_DATA@/../doctor.py /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/bin/hpcstack-doctor

# --- step sanitycheck: check imports, build flags and dependencies
# in the background, while the actions after it run; the step waits for it at its end
/global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv/bin/python -c 'import os, sys
import torch
import torchvision
import torchaudio
import torchmetrics
import torchtext
import tensorboard
import tensorboard_plugin_profile
import tensorboard_plugin_wit
import torch_tb_profiler
import horovod.torch
import sklearn
import ipykernel
print("imports ok: torch, torchvision, torchaudio, torchmetrics, torchtext, tensorboard, tensorboard_plugin_profile, tensorboard_plugin_wit, torch_tb_profiler, horovod.torch, sklearn, ipykernel")
def _hpcstack_check_0():
    import re
    archs = (torch._C._cuda_getArchFlags())
    archs = archs if isinstance(archs, str) else " ".join(str(a) for a in archs)
    print(archs)
    sass = [int(a) for a in re.findall(r"\bsm_(\d+)\b", archs)]
    ptx = [int(a) for a in re.findall(r"\bcompute_(\d+)\b", archs)]
    bad = [cc for cc in [80] if not (any(a // 10 == cc // 10 and a % 10 <= cc % 10 for a in sass)
                                                 or any(p <= cc for p in ptx))]
    if bad:
        sys.exit("torch GPU architectures: " + archs + " do not run on compute capability "
                 + ", ".join("%d.%d" % divmod(cc, 10) for cc in bad))
print("--- hpcstack check: torch GPU architectures"); _hpcstack_check_0()
def _hpcstack_check_1():
    REQUIRED = ["PyTorch", "MPI", "Gloo", "NCCL"]
    import glob, os, horovod, horovod.torch as hvd, horovod.runner.launch
    def _ext(fw):
        return bool(glob.glob(os.path.join(os.path.dirname(horovod.__file__), fw, "mpi_lib*.so")))
    flags = {"Frameworks": {"TensorFlow": _ext("tensorflow"), "PyTorch": True, "MXNet": _ext("mxnet")},
             "Controllers": {"MPI": bool(hvd.mpi_built()), "Gloo": bool(hvd.gloo_built())},
             "Operations": {"NCCL": bool(hvd.nccl_built()), "DDL": bool(hvd.ddl_built()),
                            "CCL": bool(hvd.ccl_built()), "MPI": bool(hvd.mpi_built()),
                            "Gloo": bool(hvd.gloo_built())}}
    headings = {"Frameworks": "Available Frameworks", "Controllers": "Available Controllers",
                "Operations": "Available Tensor Operations"}
    print("Horovod v%s:" % horovod.__version__)
    for section, names in flags.items():
        print("\n%s:" % headings[section])
        for name, built in names.items():
            print("    [%s] %s" % ("X" if built else " ", name))
    missing = []
    for req in REQUIRED:
        section, _, name = req.rpartition(":")
        sections = [section] if section else [s for s in flags if name in flags[s]]
        if not sections:
            missing.append(name)
        missing += ["%s:%s" % (s, name) for s in sections if not flags.get(s, {}).get(name, False)]
    if missing:
        sys.exit("horovod build flags: missing " + ", ".join("[X] " + m for m in missing))
print("--- hpcstack check: horovod build flags"); _hpcstack_check_1()
def _hpcstack_check_2():
    import glob
    paths = ["/global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/bin/hpcstack-train-benchmark", *sorted(glob.glob("/global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/lib/hpcstack-train/hpcstack_train/*.py"))]
    for path in paths:
        with open(path) as f:
            compile(f.read(), path, "exec")
    sys.dont_write_bytecode, written = True, sys.dont_write_bytecode
    sys.path.insert(0, "/global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/lib/hpcstack-train")
    try:
        import hpcstack_train.cli
    finally:
        sys.path.pop(0)
        sys.dont_write_bytecode = written
    print("compiles:", len(paths), "files; imports:", hpcstack_train.cli.__name__)
print("--- hpcstack check: trainer"); _hpcstack_check_2()
sys.stdout.flush(); sys.stderr.flush(); os._exit(0)' &
hpcstack_sanitycheck_1=$!
env -u UV_CONFIG_FILE -u UV_INDEX -u UV_DEFAULT_INDEX -u UV_INDEX_URL -u UV_EXTRA_INDEX_URL -u UV_FIND_LINKS -u UV_NO_INDEX -u UV_INDEX_STRATEGY -u UV_TORCH_BACKEND -u UV_INSECURE_HOST -u UV_NO_VERIFY_HASHES -u UV_CONSTRAINT -u UV_OVERRIDE -u UV_BUILD_CONSTRAINT -u UV_EXCLUDE_NEWER -u UV_PRERELEASE -u UV_RESOLUTION -u UV_NO_BINARY -u UV_NO_BUILD -u UV_NO_BUILD_ISOLATION -u UV_SYSTEM_PYTHON -u UV_BREAK_SYSTEM_PACKAGES -u UV_NO_CACHE -u UV_COMPILE_BYTECODE @UV@ pip check --python /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv/bin/python --no-config
/global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/bin/extend-venv-activate --help
/global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv/bin/python /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/bin/hpcstack-doctor --help
mkdir -p /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/.hpcstack && @UV@ pip freeze --python /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/venv/bin/python --no-config > /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@/.hpcstack/pip-freeze.txt
wait "$hpcstack_sanitycheck_1"

# --- step permissions: make the stack world-readable and not world-writable
chmod -R u+rwX,go+rX,go-w /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-@BUILD@
find /global/common/software/PROJECT/hpcstack/pytorch -maxdepth 0 -user @USER@ -exec chmod u+rwX,go+rX,go-w '{}' +

# --- step module: publish the stack (switch its prefix link atomically) and write the modulefile
[ -L /global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu ] || [ ! -d /global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu ] || mv -T /global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu-pre-staging
ln -sfn .2.3.1-gpu-@BUILD@ /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu.publish-tmp
mv -T /global/common/software/PROJECT/hpcstack/pytorch/.2.3.1-gpu.publish-tmp /global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu
mkdir -p /global/common/software/PROJECT/hpcstack/modulefiles/pytorch
hpcstack_tmp=$(mktemp /global/common/software/PROJECT/hpcstack/modulefiles/pytorch/.2.3.1-gpu.lua.XXXXXX)
cat > "$hpcstack_tmp" <<'HPCSTACK_EOF'
-- pytorch/2.3.1-gpu: PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1 and TensorBoard
-- Written by hpcstack 0.3.0 from recipe pytorch/2.3.1-gpu for site perlmutter.

help([[
pytorch/2.3.1-gpu: PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1 and TensorBoard

Load it with `module load pytorch/2.3.1-gpu`; it loads python first (depends-on).
The stack lives in /global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu (HPCSTACK_PYTORCH_ROOT); its python is on PATH and its
site-packages on PYTHONPATH.

Your own packages on top of the stack: make a venv and extend it, e.g.
    module load pytorch/2.3.1-gpu
    python -m venv ~/myvenv
    extend-venv-activate ~/myvenv
Then `source ~/myvenv/bin/activate` loads this module (if it is not loaded yet) and
puts the venv first, and `deactivate` unloads it again (only if activate loaded it).
`extend-venv-activate --help` says more; `extend-venv-activate --undo ~/myvenv`
restores the venv's original activate scripts.

As a Jupyter kernel (JupyterLab, JupyterHub, Open OnDemand), in the stack's own
Python and ipykernel; the kernel loads this module when it starts (run it with
this module loaded: it finds the site itself):
    hpcstack kernel install pytorch/2.3.1-gpu --user
(add --venv ~/myvenv for a venv extended as above); undo it with
    hpcstack kernel remove pytorch/2.3.1-gpu --user

What is in it (every package and its version: /global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu/.hpcstack/pip-freeze.txt):
    torch 2.3.1, torchvision 0.18.1, torchaudio 2.3.1, torchmetrics 1.0.3,
    torchtext 0.18.0, tensorboard 2.17.0, tensorboard_plugin_profile 2.15.2,
    tensorboard-plugin-wit 1.8.1, torch-tb-profiler 0.4.3, scikit-learn
    1.5.1, ipykernel 6.29.5, numpy 1.26.4, cffi 1.16.0, cloudpickle 3.0.0,
    psutil 6.0.0, pyyaml 6.0.1, packaging 24.1, horovod 0.28.1

What loading it changes (unloading restores each):
    HPCSTACK_PYTORCH_ROOT:
    /global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu, the stack
    PATH: $HPCSTACK_PYTORCH_ROOT/venv/bin and $HPCSTACK_PYTORCH_ROOT/bin
    first: the stack's python, extend-venv-activate, hpcstack-doctor, and a
    `pip` that says where your packages go (the stack itself is read-only)
    PYTHONPATH: $HPCSTACK_PYTORCH_ROOT/venv/lib/python3.11/site-packages (an
    extended venv puts its own first)
    PYTHONNOUSERSITE=1: packages in your user site (~/.local, `pip install
    --user`) are not imported; a value of your own is replaced
    PIP_CONSTRAINT,
    UV_CONSTRAINT=$HPCSTACK_PYTORCH_ROOT/.hpcstack/constraints.txt: replace
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
    module load pytorch/2.3.1-gpu
    export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
    srun python train.py                   # one rank per task (MPI, Horovod)
  PyTorch DDP with torchrun, one launcher per node:
    srun --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint=$(hostname):29500 train.py
  Horovod on one node, without Slurm:
    horovodrun -np 4 -H localhost:4 python train.py

Examples: /global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu/examples (digits); copy one to run it, e.g.
    cp -r /global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu/examples/digits ~/ && cd ~/digits
]])

whatis("Description: PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1 and TensorBoard")

family("pytorch")
whatis("Version: 2.3.1-gpu")
whatis("Packages: torch 2.3.1, torchvision 0.18.1, torchaudio 2.3.1, torchmetrics 1.0.3, torchtext 0.18.0, tensorboard 2.17.0, tensorboard_plugin_profile 2.15.2, tensorboard-plugin-wit 1.8.1, torch-tb-profiler 0.4.3, scikit-learn 1.5.1, ipykernel 6.29.5, numpy 1.26.4, cffi 1.16.0, cloudpickle 3.0.0, psutil 6.0.0, pyyaml 6.0.1, packaging 24.1, horovod 0.28.1")
whatis("Keywords: pytorch, torch, torchvision, torchaudio, torchmetrics, torchtext, tensorboard, tensorboard_plugin_profile, tensorboard-plugin-wit, torch-tb-profiler, scikit-learn, ipykernel, numpy, cffi, cloudpickle, psutil, pyyaml, packaging, horovod, deep learning, machine learning, neural networks, GPU, CUDA, MPI, distributed training, Jupyter")
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
    if checked and not text:find("# >>> hpcstack pytorch/2.3.1-gpu >>>", 1, true) then
        local shown = venv:gsub("%c", "?")
        LmodMessage((("pytorch/2.3.1-gpu: the active venv @VENV@ is not extended for this module, so `python` is now the stack's while `pip` installs into the venv, where that python does not look; fix: module unload pytorch/2.3.1-gpu; deactivate; module load pytorch/2.3.1-gpu; extend-venv-activate @VENV@; source @VENV@/bin/activate"):gsub("@VENV@", function() return shown end)))
    end
end

if mode() == "load" then
    local ok, verdict = pcall(function()
        if lfs.attributes("/global/common/software/PROJECT/hpcstack/modulefiles/.hpcstack-status.json", "mode") ~= "file" then return nil end
        local fh = io.open("/global/common/software/PROJECT/hpcstack/modulefiles/.hpcstack-status.json", "r")
        if not fh then return nil end
        local text = fh:read(65536) or ""
        fh:close()
        local needle = "\n\"pytorch/2.3.1-gpu\": \""
        local at = text:find(needle, 1, true)
        if not at then return nil end
        return text:match('^([^"\n]+)"', at + #needle)
    end)
    if ok and verdict then
        LmodMessage("pytorch/2.3.1-gpu: " .. verdict .. " (hpcstack status for details)")
    end
end

if mode() == "load" and os.getenv("SLURM_EXPORT_ENV") == "NONE" then
    setenv("SLURM_EXPORT_ENV", "ALL")
end

if mode() == "load" and not isFile("/global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu/venv/pyvenv.cfg") then
    LmodError("pytorch/2.3.1-gpu: its stack /global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu is missing or unreadable on this machine; tell the site's admins (`module avail pytorch` lists the other versions)")
end

local root = "/global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu"
setenv("HPCSTACK_PYTORCH_ROOT", root)
prepend_path("PATH", "/global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu/bin")
prepend_path("PATH", "/global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu/venv/bin")
prepend_path("PYTHONPATH", "/global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu/venv/lib/python3.11/site-packages")
setenv("PYTHONNOUSERSITE", "1")
setenv("PIP_CONSTRAINT", "/global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu/.hpcstack/constraints.txt")
setenv("UV_CONSTRAINT", "/global/common/software/PROJECT/hpcstack/pytorch/2.3.1-gpu/.hpcstack/constraints.txt")
setenv("NCCL_SOCKET_IFNAME", "hsn")
setenv("MPICH_GPU_SUPPORT_ENABLED", "0")
HPCSTACK_EOF
chmod 644 "$hpcstack_tmp"
mv -fT "$hpcstack_tmp" /global/common/software/PROJECT/hpcstack/modulefiles/pytorch/2.3.1-gpu.lua
# default version, only if pytorch has none yet
if ! { [ -e /global/common/software/PROJECT/hpcstack/modulefiles/pytorch/.modulerc ] || [ -L /global/common/software/PROJECT/hpcstack/modulefiles/pytorch/.modulerc ] || [ -e /global/common/software/PROJECT/hpcstack/modulefiles/pytorch/.version ] || [ -L /global/common/software/PROJECT/hpcstack/modulefiles/pytorch/.version ] || [ -e /global/common/software/PROJECT/hpcstack/modulefiles/pytorch/.modulerc.lua ] || [ -L /global/common/software/PROJECT/hpcstack/modulefiles/pytorch/.modulerc.lua ] || [ -e /global/common/software/PROJECT/hpcstack/modulefiles/pytorch/default ] || [ -L /global/common/software/PROJECT/hpcstack/modulefiles/pytorch/default ]; }; then
mkdir -p /global/common/software/PROJECT/hpcstack/modulefiles/pytorch
hpcstack_tmp=$(mktemp /global/common/software/PROJECT/hpcstack/modulefiles/pytorch/..modulerc.lua.XXXXXX)
cat > "$hpcstack_tmp" <<'HPCSTACK_EOF'
-- The default version of pytorch: `module load pytorch` loads pytorch/2.3.1-gpu.
-- Written by hpcstack module set-default; read by Lmod (before .modulerc and .version).
-- Change it with: hpcstack module set-default pytorch/VERSION --site perlmutter
module_version("pytorch/2.3.1-gpu", "default")
HPCSTACK_EOF
chmod 644 "$hpcstack_tmp"
mv -fT "$hpcstack_tmp" /global/common/software/PROJECT/hpcstack/modulefiles/pytorch/.modulerc.lua
fi

# afterwards hpcstack removes earlier builds of the stack but the one this replaced
