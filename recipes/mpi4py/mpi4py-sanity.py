"""Sanity check of the mpi4py stack: built with the site's MPI wrapper, loading the site's MPI.

Usage: python mpi4py-sanity.py WRAPPER (the site's toolchain.cc, e.g. mpicc). Exit status 1,
with one line per problem, when mpi4py.get_config() names another compiler, or when the MPI
library loaded is neither the version the wrapper reports (MPI.Get_library_version() holds the
version of ``--showme:version``, Open MPI, or ``-v``, MPICH) nor a library from the wrapper's
``-L`` directories (``-show``; Cray's ``--cray-print-opts=libs``).
"""

import os
import re
import shutil
import subprocess
import sys

import mpi4py
from mpi4py import MPI

wrapper = sys.argv[1]
problems = []
configured = mpi4py.get_config().get("mpicc", "")
want = shutil.which(wrapper) or wrapper
if os.path.basename(configured) != os.path.basename(wrapper) and \
        os.path.realpath(shutil.which(configured) or configured) != os.path.realpath(want):
    problems.append(f"mpi4py.get_config() names {configured!r}, not the site's wrapper {wrapper!r}")
library = MPI.Get_library_version().replace("\x00", "").strip()


def wrapper_output(*args):
    try:
        proc = subprocess.run([want, *args], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        return None, exc.strerror
    return proc.returncode, proc.stdout + proc.stderr


# the MPI the wrapper compiles against: its version (Open MPI: --showme:version; MPICH: -v), and
# the library directories it links from (-show; Cray's compiler wrappers: --cray-print-opts=libs)
reported = ""
for args in (["--showme:version"], ["-v"]):
    code, text = wrapper_output(*args)
    found = re.search(r"\b(\d+\.\d+(?:\.\d+)?)\b", text or "")
    if code == 0 and found:
        reported = found.group(1)
        break
dirs = set()
for args in (["-show"], ["--cray-print-opts=libs"]):
    code, text = wrapper_output(*args)
    if code == 0:
        dirs |= {os.path.realpath(d) for d in re.findall(r"-L\s*(\S+)", text)}
with open("/proc/self/maps") as maps:
    loaded = {os.path.realpath(line.split()[-1]) for line in maps
              if re.search(r"/lib[a-z_]*mpi[a-z_0-9]*\.so", line.split()[-1])}
same_dir = any(os.path.dirname(path) in dirs for path in loaded)
if not (reported and reported in library) and not same_dir:
    problems.append(f"MPI.Get_library_version() is {library.splitlines()[0]!r} and the MPI libraries loaded "
                    f"are {sorted(loaded) or 'none'}: neither the MPI {reported or '(version unknown)'} "
                    f"that {wrapper} reports nor one from its library directories {sorted(dirs) or '(none)'}")
for line in problems:
    print(f"mpi4py sanity: {line}", file=sys.stderr)
if not problems:
    print(f"mpi4py {mpi4py.__version__}: built with {configured}; {library.splitlines()[0]}")
sys.exit(1 if problems else 0)
