"""Sanity check of the mpi4py stack: built with the site's MPI wrapper, loading the site's MPI.

Usage: python mpi4py-sanity.py WRAPPER (the site's toolchain.cc, e.g. mpicc). Exit status 1,
with one line per problem, when mpi4py.get_config() names another compiler or when
MPI.Get_library_version() does not hold the version the wrapper reports (Open MPI:
``--showme:version``; MPICH and others: ``-v``).
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
library = MPI.Get_library_version().strip()
reported = ""
for args in (["--showme:version"], ["-v"]):
    try:
        proc = subprocess.run([want, *args], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        problems.append(f"{wrapper}: {exc.strerror}")
        break
    found = re.search(r"\b(\d+\.\d+(?:\.\d+)?)\b", proc.stdout + proc.stderr)
    if proc.returncode == 0 and found:
        reported = found.group(1)
        break
if not reported:
    problems.append(f"{wrapper} reports no MPI version (--showme:version, -v)")
elif reported not in library:
    problems.append(f"MPI.Get_library_version() is {library.splitlines()[0]!r}: not the MPI {reported} "
                    f"that {wrapper} compiles against")
for line in problems:
    print(f"mpi4py sanity: {line}", file=sys.stderr)
if not problems:
    print(f"mpi4py {mpi4py.__version__}: built with {configured}; {library.splitlines()[0]}")
sys.exit(1 if problems else 0)
