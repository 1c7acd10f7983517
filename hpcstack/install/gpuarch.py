"""Which GPUs a prebuilt wheel's CUDA code runs on: read from the wheel, checked against a site.

A CUDA library carries device code in a fat binary: SASS (machine code, ``sm_XY``) for some
architectures and maybe PTX (``compute_XY``, the virtual ISA the driver JIT-compiles). The
CUDA C Programming Guide's compatibility rules (sections "Binary Compatibility" and "PTX
Compatibility"): SASS for ``sm_AB`` runs on a GPU of compute capability ``X.Y`` when ``A == X``
and ``B <= Y`` (within one major, never across), and PTX for ``compute_AB`` can be JIT-compiled
for any ``X.Y >= A.B``. Architecture-specific SASS (``sm_90a``, ``sm_100a``: suffix ``a``/``f``)
runs only on its own GPUs and is not counted.

Reading: ``cuobjdump --list-elf --list-ptx`` (NVIDIA's ``nvidia-cuda-cuobjdump`` wheel, which
``scripts/localhost-cuda-tools`` installs; a CUDA toolkit's own serves as well) on the libraries a
recipe names, extracted from the wheel into a temporary directory: the wheel is never installed.
cuobjdump 13.x stops with ``Invalid ELF`` at the ``sm_90`` cubins that CUDA 12.1 wrote (torch
2.3.1's libraries; cuobjdump 12.4 reads them), so where cuobjdump fails the fat binaries' own
entry headers (the ``.nv_fatbin`` section: one header per entry with its kind and architecture)
are read instead, and the record says which reader answered. A library's architectures are those
its kernels were all built for: an architecture with far fewer entries than the library's most
common one (torch 2.14.1 carries one ``sm_89`` cubin beside 475 of ``sm_86``) is listed as partial
and not counted. A wheel runs on a GPU where every one of its named libraries does.

Records: reading a 0.5-1 GB wheel takes its download and 15-25 s (on 2 shared cores), so
``hpcstack lock`` keeps the result beside the lock (``<lock stem>.gpu-archs.json``, keyed by the
wheel file's sha256, which the lock pins), and the install's preflight and ``--dry-run`` read that
record. Without one (a lock whose index was not reachable where it was written) they say so in
one line and go on; the sanity check then asks the installed package, before anything is
published (:class:`hpcstack.install.components.cudawheels.CudaWheelArchs`).
"""

from __future__ import annotations

import collections
import errno
import fnmatch
import hashlib
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field

from hpcstack import gate
from hpcstack.errors import HpcstackError
from hpcstack.fsutil import CHILD_CWD

#: The name of the cuobjdump program; found on PATH, else where scripts/localhost-cuda-tools puts it.
CUOBJDUMP = "cuobjdump"
#: Where ``scripts/localhost-cuda-tools`` installs NVIDIA's cuobjdump (the ``--root`` default).
CUOBJDUMP_FALLBACK = "/opt/hpcstack/cuda-tools/bin/cuobjdump"
#: An architecture counts for a library when it has at least this share of the entries of the
#: library's most common architecture (all its kernels were built for it).
FULL_SHARE = 0.9
#: The record format's version (a field of the record file).
RECORD_VERSION = 1

_ENTRY = re.compile(r"^(ELF|PTX) file\s+\d+:\s+\S*?\.(sm_\d+[a-z]?)\.(?:cubin|ptx)\s*$", re.M)


def cc_text(cc: int) -> str:
    """``70`` -> ``"7.0"``, ``100`` -> ``"10.0"`` (a compute capability as NVIDIA writes it)."""
    return f"{cc // 10}.{cc % 10}"


def runs_on(cc: int, sass: tuple[int, ...], ptx: tuple[int, ...]) -> bool:
    """True if code with these architectures runs on a GPU of compute capability ``cc``.

    Args:
        cc (int): the GPU's compute capability times ten (``70`` for 7.0, ``120`` for 12.0).
        sass (tuple[int, ...]): the ``sm_XY`` the code carries, as ``XY`` (``75``, ``100``).
        ptx (tuple[int, ...]): the ``compute_XY`` PTX it carries.

    Returns:
        bool: some SASS of the same major and a minor no higher, or PTX no newer than ``cc``.
    """
    return (any(a // 10 == cc // 10 and a % 10 <= cc % 10 for a in sass)
            or any(p <= cc for p in ptx))


@dataclass(frozen=True)
class WheelArchs:
    """The GPU architectures one wheel file carries (a record).

    Attributes:
        file (str): the wheel's file name.
        sha256 (str): its sha256 (hex).
        cuda (str | None): the CUDA ``X.Y`` it was built for (its ``+cuXYZ`` label or its CUDA
            runtime requirement), None when it says none.
        sass (tuple[int, ...]): the ``sm_XY`` the named libraries carry in full, as ``XY``
            (the union: what the messages show).
        ptx (tuple[int, ...]): the ``compute_XY`` PTX they carry, as ``XY`` (the union).
        partial (tuple[str, ...]): architectures some kernels carry beyond those (``sm_89``,
            ``sm_90a``); informative, never counted.
        libraries (tuple[tuple[str, tuple, tuple], ...]): per wheel member read, its name, SASS
            and PTX; a GPU must run every one (torch 2.3.1's ``libtorch_cuda_linalg.so`` has no
            ``sm_75``: a 7.5 GPU runs its ``sm_70``).
        reader (str): what read them (``cuobjdump 13.5.37``, or the fat binary headers).
    """

    file: str
    sha256: str
    cuda: str | None
    sass: tuple = ()
    ptx: tuple = ()
    partial: tuple = ()
    libraries: tuple = ()
    reader: str = ""

    def describe(self) -> str:
        """``torch-….whl (CUDA 13.0) has SASS sm_75 … sm_120 and PTX none``."""
        sass = " ".join(f"sm_{a}" for a in self.sass) or "none"
        ptx = " ".join(f"compute_{a}" for a in self.ptx) or "none"
        cuda = f"CUDA {self.cuda}" if self.cuda else "CUDA version not stated"
        return f"{self.file} ({cuda}) has SASS {sass} and PTX {ptx}"

    def unsupported(self, cc_list) -> list[int]:
        """The capabilities of ``cc_list`` some library of this wheel does not run on
        (:func:`runs_on`; every library when :attr:`libraries` is known, else the union)."""
        libs = [(s, p) for _, s, p in self.libraries] or [(self.sass, self.ptx)]
        return [cc for cc in cc_list if not all(runs_on(cc, s, p) for s, p in libs)]

    def problems(self, cc_list, what: str = "") -> list[str]:
        """One line per capability of ``cc_list`` the wheel does not run on.

        Args:
            cc_list (Iterable[int]): the site's compute capabilities (``toolchain.cuda.cc_list``).
            what (str): the pin, e.g. ``"torch==2.14.1"``, named before the file.
        """
        lines = []
        for cc in self.unsupported(cc_list):
            # a library that alone lacks the capability (torch 2.14.1's linear algebra on a 7.5 GPU)
            short = [f"{os.path.basename(n)} has only SASS {' '.join(f'sm_{a}' for a in s) or 'none'} "
                     f"and PTX {' '.join(f'compute_{a}' for a in p) or 'none'}"
                     for n, s, p in self.libraries if not runs_on(cc, s, p)]
            which = f" ({'; '.join(short)})" if runs_on(cc, self.sass, self.ptx) else ""
            lines.append(f"toolchain.cuda.cc_list: compute capability {cc_text(cc)} is not supported by "
                         f"{what or self.file}: {self.describe()}{which}; a {cc_text(cc)} GPU needs SASS "
                         f"sm_{cc // 10}x (x <= {cc % 10}) or PTX compute_XY (XY <= {cc}); use wheels built "
                         f"for it or drop {cc} from cc_list")
        return lines

    def to_json(self) -> dict:
        """The record as JSON data (lists for tuples; libraries as ``{name: {sass, ptx}}``)."""
        data = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        data["libraries"] = {n: {"sass": list(s), "ptx": list(p)} for n, s, p in self.libraries}
        return data

    @classmethod
    def from_json(cls, data: dict) -> "WheelArchs":
        """The record back from :meth:`to_json`."""
        names = {f for f in cls.__dataclass_fields__}
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names}
        fields["libraries"] = tuple((n, tuple(v.get("sass", ())), tuple(v.get("ptx", ())))
                                    for n, v in (data.get("libraries") or {}).items())
        return cls(**fields)


def find_cuobjdump(path: str | None = None) -> str | None:
    """``cuobjdump`` on ``path`` (default PATH), else :data:`CUOBJDUMP_FALLBACK`, else None."""
    found = shutil.which(CUOBJDUMP, path=path)
    if found:
        return found
    return CUOBJDUMP_FALLBACK if os.access(CUOBJDUMP_FALLBACK, os.X_OK) else None


def _cuobjdump_version(cuobjdump: str) -> str:
    out = subprocess.run([cuobjdump, "--version"], capture_output=True, text=True, cwd=CHILD_CWD).stdout
    m = re.search(r"V(\d+\.\d+\.\d+)", out)
    return f"cuobjdump {m.group(1)}" if m else "cuobjdump"


def cuobjdump_entries(library: str, cuobjdump: str) -> collections.Counter | None:
    """Count the library's fat binary entries by (kind, architecture) with ``cuobjdump``.

    Args:
        library (str): a shared library.
        cuobjdump (str): the cuobjdump program.

    Returns:
        Counter | None: ``{("sass", "sm_80"): 475, ("ptx", "sm_90"): 3, …}``; an empty counter
        when the library holds no device code; None when cuobjdump fails on it (``Invalid ELF``).
    """
    counts: collections.Counter = collections.Counter()
    proc = subprocess.run([cuobjdump, "--list-elf", "--list-ptx", library], capture_output=True, text=True, cwd=CHILD_CWD,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        if "does not contain device code" in proc.stderr + proc.stdout:
            return counts
        return None
    for kind, arch in _ENTRY.findall(proc.stdout):
        counts[("sass" if kind == "ELF" else "ptx", arch)] += 1
    return counts


def fatbin_entries(library: str) -> collections.Counter:
    """Count the library's fat binary entries by (kind, architecture) from the entry headers.

    The ``.nv_fatbin`` section holds fat binaries, each a header (magic ``0xBA55ED50``, version,
    header size, size) and entries, each with its own header: kind (1 PTX, 2 ELF/SASS), header
    size, payload size, and the architecture at byte 28. Architecture-specific entries
    (``sm_90a``) are not told apart here; they carry the plain number and are few, so they are
    partial anyway.

    Args:
        library (str): a shared library (64-bit little-endian ELF); the section is found by
            its name in the ELF section header table. :func:`read_wheel` gives it the copies it
            made in its own temporary directory.

    Raises:
        HpcstackError: not a regular file (opened ``O_NOFOLLOW|O_NONBLOCK``: a link is not
            followed, a FIFO does not block), or not a 64-bit little-endian ELF file.
        OSError: the library cannot be opened.
    """
    fd = os.open(library, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise HpcstackError(f"{library}: not a regular file: not read")
    with os.fdopen(fd, "rb") as f:
        ident = f.read(64)
        if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
            raise HpcstackError(f"{library}: not a 64-bit little-endian ELF file")
        shoff, = struct.unpack_from("<Q", ident, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        headers = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
        f.seek(headers[shstrndx][4])
        names = f.read(headers[shstrndx][5])
        counts: collections.Counter = collections.Counter()
        for name_off, _type, _flags, _addr, offset, size in headers:
            if names[name_off:names.index(b"\0", name_off)] != b".nv_fatbin":
                continue
            f.seek(offset)
            data = f.read(size)
            pos = 0
            while pos + 16 <= len(data):
                magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", data, pos)
                if magic != 0xBA55ED50:
                    pos += 8  # fat binaries are 8-byte aligned in the section
                    continue
                entry, end = pos + hsize, pos + hsize + fsize
                while entry + 32 <= end:
                    kind, _, ehsize, psize = struct.unpack_from("<HHIQ", data, entry)
                    arch, = struct.unpack_from("<I", data, entry + 28)
                    if kind in (1, 2):
                        counts[("ptx" if kind == 1 else "sass", f"sm_{arch}")] += 1
                    entry += ehsize + psize
                pos = end
    return counts


def _split(counts: collections.Counter) -> tuple[set, set, set]:
    """Full SASS, full PTX (as ints) and partial names of one library's entries."""
    sass, ptx, partial = set(), set(), set()
    top = max(counts.values(), default=0)
    for (kind, arch), n in counts.items():
        plain = re.fullmatch(r"sm_(\d+)", arch)
        if plain and n >= FULL_SHARE * top:
            (sass if kind == "sass" else ptx).add(int(plain.group(1)))
        else:
            partial.add(arch if kind == "sass" else arch.replace("sm_", "compute_"))
    return sass, ptx, partial


def cuda_of_wheel(names: list[str], read) -> str | None:
    """The CUDA ``X.Y`` a wheel says it was built for, or None.

    From its version's local label (``2.3.1+cu121`` -> ``12.1``), else from its metadata's
    requirement on the CUDA runtime (``nvidia-cuda-runtime-cu12==12.1.105``,
    ``cuda-toolkit[…]==13.0.3``).

    Args:
        names (list[str]): the wheel's member names.
        read (Callable[[str], bytes]): reads a member.
    """
    from email.parser import Parser

    from packaging.requirements import InvalidRequirement, Requirement

    meta = next((n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
    if meta is None:
        return None
    msg = Parser().parsestr(read(meta).decode("utf-8", "replace"))
    m = re.search(r"\+cu(\d+)(\d)$", msg.get("Version", ""))
    if m:
        return f"{m.group(1)}.{m.group(2)}"
    for text in msg.get_all("Requires-Dist") or []:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if re.fullmatch(r"nvidia-cuda-runtime(-cu\d+)?|cuda-toolkit|nvidia-cuda-runtime", req.name.lower()):
            for spec in req.specifier:
                v = re.match(r"(\d+)\.(\d+)", spec.version)
                if spec.operator in ("==", "~=", ">=") and v:
                    return f"{v.group(1)}.{v.group(2)}"
    return None


#: The most bytes of a wheel's ``METADATA`` read from an unpacked wheel.
MAX_METADATA = 16 << 20


def _is_metadata(name: str) -> bool:
    """The wheel's own ``<name>.dist-info/METADATA`` (a member at the top's level + 1)."""
    return name.count("/") == 1 and name.endswith(".dist-info/METADATA")


def _copy_out(fin: int, dest: str) -> None:
    """Copy the open file ``fin`` to the new file ``dest`` (``O_EXCL|O_NOFOLLOW``, in the
    caller's own temporary directory)."""
    fout = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        while block := os.read(fin, 1 << 20):
            view = memoryview(block)
            while view:
                view = view[os.write(fout, view):]
    finally:
        os.close(fout)


def _unpacked(top: int, where: str, libraries: tuple[str, ...],
              tmp: str) -> tuple[list[str], dict[str, str], dict[str, bytes]]:
    """Read a wheel unpacked into the directory ``top`` (a descriptor from the gate; ``where``
    its path, for messages) by descriptor: its tree walked with :func:`os.fwalk` (no linked
    directory entered), each file wanted (a member matching ``libraries``, the ``METADATA``)
    opened ``O_NOFOLLOW|O_NONBLOCK`` relative to its directory and checked by ``fstat`` (a
    regular file), the members copied into ``tmp``.

    Returns:
        tuple: the member names (``/``-separated), ``{member: its copy in tmp}`` and
        ``{METADATA name: its bytes}``.

    Raises:
        HpcstackError: a wanted member is a link or not a regular file, or a METADATA is too large.
        OSError: a member cannot be read.
    """
    names, paths, meta = [], {}, {}
    for dirpath, _dirs, files, dfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
        for f in files:
            rel = os.path.normpath(os.path.join(dirpath, f)).replace(os.sep, "/")
            names.append(rel)
            member = any(fnmatch.fnmatch(rel, p) for p in libraries)
            if not member and not _is_metadata(rel):
                continue
            try:
                fin = os.open(f, gate.FILE_READ, dir_fd=dfd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise HpcstackError(f"{where}/{rel}: a symbolic link (not followed): not read") from None
                raise OSError(exc.errno, exc.strerror, f"{where}/{rel}") from None
            try:
                st = os.fstat(fin)
                if not stat.S_ISREG(st.st_mode):
                    raise HpcstackError(f"{where}/{rel}: not a regular file: not read")
                if member:
                    paths[rel] = os.path.join(tmp, f"{len(paths)}-{f}")
                    _copy_out(fin, paths[rel])
                else:
                    if st.st_size > MAX_METADATA:
                        raise HpcstackError(f"{where}/{rel}: larger than {MAX_METADATA} bytes: not read")
                    meta[rel] = os.read(fin, MAX_METADATA)
            finally:
                os.close(fin)
    return names, paths, meta


def read_wheel(wheel: str, libraries: tuple[str, ...], cuobjdump: str | None = None, *,
               pol=None) -> WheelArchs:
    """Read the GPU architectures of a wheel file, or of a wheel unpacked into a directory.

    The wheel is reached through the gate (:mod:`hpcstack.gate`; links on the way resolved only
    where trusted accounts alone can have put them, :func:`hpcstack.gate.resolved`): a file is
    opened once (:func:`hpcstack.gate.open_file`: ``O_NOFOLLOW|O_NONBLOCK``, a regular file by
    ``fstat``, so a FIFO neither blocks nor is read), hashed and read as a zip from that one
    descriptor, so the sha256 recorded is that of the bytes read; a directory is opened with
    :func:`hpcstack.gate.open_dir` and read by descriptor (:func:`os.fwalk`, members opened
    ``O_NOFOLLOW``). The members matching ``libraries`` are extracted (copied) into a new
    temporary directory and read there with cuobjdump (:func:`cuobjdump_entries`), else from
    the fat binary headers (:func:`fatbin_entries`) where cuobjdump fails. Each library's SASS
    and PTX are those its kernels carry in full; libraries without device code are left out.

    Args:
        wheel (str): a ``.whl`` file, or a directory holding an unpacked wheel.
        libraries (tuple[str, ...]): member patterns (:mod:`fnmatch`), e.g.
            ``("torch/lib/libtorch_cuda*.so",)``.
        cuobjdump (str | None): the program; default :func:`find_cuobjdump`.
        pol (hpcstack.trust.Policy | None): whom to trust for the wheel and the directories
            above it (default :func:`hpcstack.gate.current_policy`).

    Returns:
        WheelArchs: the record (sha256 ``""`` for a directory).

    Raises:
        HpcstackError: no cuobjdump, an unreadable wheel, or no member matching ``libraries``
            holds device code; :class:`hpcstack.gate.GateError`: the wheel is a link, not a
            regular file or directory, or a file or directory that an untrusted account can
            change (one line).
    """
    cuobjdump = cuobjdump or find_cuobjdump()
    if cuobjdump is None:
        raise HpcstackError("no cuobjdump to read the wheel's GPU architectures: run "
                            "scripts/localhost-cuda-tools (NVIDIA's nvidia-cuda-cuobjdump wheel) "
                            "or put a CUDA toolkit's bin on PATH")
    path = gate.resolved(os.path.abspath(wheel), pol)
    try:
        is_dir = stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError as exc:
        raise HpcstackError(f"{wheel}: cannot read the wheel ({exc.strerror})") from None
    readers = set()
    with tempfile.TemporaryDirectory(prefix="hpcstack-gpu-archs-") as tmp:
        try:
            if is_dir:
                with gate.directory(path, pol) as top:
                    names, paths, meta = _unpacked(top, path, libraries, tmp)
                sha256, file = "", os.path.basename(os.path.normpath(wheel))
                cuda = cuda_of_wheel(names, meta.__getitem__)
            else:
                with os.fdopen(gate.open_file(path, pol), "rb") as f:   # one descriptor: hashed, then read
                    digest = hashlib.sha256()
                    while block := f.read(1 << 20):
                        digest.update(block)
                    f.seek(0)
                    with zipfile.ZipFile(f) as z:
                        names = z.namelist()
                        members = [n for n in names if any(fnmatch.fnmatch(n, p) for p in libraries)]
                        cuda = cuda_of_wheel(names, z.read)
                        paths = {n: z.extract(n, tmp) for n in members}
                sha256, file = digest.hexdigest(), os.path.basename(wheel)
        except (OSError, zipfile.BadZipFile) as exc:
            raise HpcstackError(f"{wheel}: cannot read the wheel ({exc})") from None
        sass, ptx, partial = set(), set(), set()
        read_libs = []
        for name in sorted(paths):
            counts = cuobjdump_entries(paths[name], cuobjdump)
            if counts is None:
                counts = fatbin_entries(paths[name])
                readers.add(f"fat binary headers ({_cuobjdump_version(cuobjdump)} failed on {os.path.basename(name)})")
            else:
                readers.add(_cuobjdump_version(cuobjdump))
            if not counts:
                continue
            s, p, part = _split(counts)
            sass |= s
            ptx |= p
            partial |= part
            read_libs.append((name, tuple(sorted(s)), tuple(sorted(p))))
    if not read_libs:
        raise HpcstackError(f"{wheel}: no member matching {', '.join(libraries)} holds GPU code")
    return WheelArchs(file, sha256, cuda, tuple(sorted(sass)), tuple(sorted(ptx)),
                      tuple(sorted(partial - {f"sm_{a}" for a in sass},
                                   key=lambda a: (int(re.sub(r"\D", "", a)), a))),
                      tuple(read_libs), "; ".join(sorted(readers)))


#: Linux x86_64 platform tags ``pip download`` may take a wheel for (old and new manylinux).
LINUX_X86_64 = ("manylinux1_x86_64", "manylinux2014_x86_64", "manylinux_2_17_x86_64",
                "manylinux_2_27_x86_64", "manylinux_2_28_x86_64", "linux_x86_64")


def download_wheel(pin, python_version: str, dest: str) -> str:
    """Download the Linux x86_64 CPython ``python_version`` wheel of ``pin`` into ``dest`` with
    ``pip download --require-hashes`` (every sha256 the lock pins), from the pin's index.

    Returns:
        str: the wheel file.

    Raises:
        HpcstackError: pip fails (no network, no such wheel).
    """
    import sys

    req = os.path.join(dest, "requirement.txt")
    with open(req, "w") as f:
        f.write(f"{pin.name}=={pin.version} " + " ".join(f"--hash=sha256:{h}" for h in pin.hashes) + "\n")
    abi = "cp" + python_version.replace(".", "")
    cmd = [sys.executable, "-I", "-m", "pip", "--isolated", "download", "--quiet", "--disable-pip-version-check",
           "--no-deps", "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
           "--abi", abi, *[a for p in LINUX_X86_64 for a in ("--platform", p)], "--index-url", pin.index,
           "--require-hashes", "-r", req, "-d", os.path.join(dest, "wheels")]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=CHILD_CWD)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["pip download failed"])[-1]
        raise HpcstackError(f"cannot download {pin.name}=={pin.version} for Python {python_version} "
                            f"from {pin.index}: {last}")
    files = [os.path.join(dest, "wheels", n) for n in os.listdir(os.path.join(dest, "wheels"))]
    return files[0]


# ----------------------------------------------------------------------------- records

def record_path(lock: str) -> str:
    """The record file of a lock: ``2.3.1-gpu.pypi.lock`` -> ``2.3.1-gpu.pypi.gpu-archs.json``."""
    base = lock[:-len(".lock")] if lock.endswith(".lock") else lock
    return base + ".gpu-archs.json"


def load_records(path: str) -> dict[str, WheelArchs]:
    """The records of a file, by sha256; empty when the file does not exist.

    Raises:
        HpcstackError: the file exists but is not a record file.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise HpcstackError(f"{path}: not a GPU architecture record ({exc})") from None
    return {sha: WheelArchs.from_json(rec) for sha, rec in (data.get("wheels") or {}).items()}


def save_records(path: str, records: dict[str, WheelArchs], package: str) -> None:
    """Write ``records`` (by sha256) to ``path`` atomically, sorted, as JSON.

    Args:
        path (str): the record file (:func:`record_path`).
        records (dict[str, WheelArchs]): by sha256.
        package (str): the package they are of, named in the file.
    """
    from hpcstack.fsutil import write_atomic

    data = {"version": RECORD_VERSION, "package": package,
            "about": "GPU architectures of the locked wheels, read by hpcstack lock with cuobjdump "
                     "(hpcstack.install.gpuarch); keyed by the wheel file's sha256",
            "wheels": {sha: records[sha].to_json() for sha in sorted(records)}}
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def wheel_fits(file: str, python_version: str | None) -> bool:
    """True if the wheel file can install on x86_64 Linux under CPython ``python_version``
    (any when None): its tags (:func:`packaging.utils.parse_wheel_filename`)."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        tags = parse_wheel_filename(file)[3]
    except InvalidWheelFilename:
        return False
    want = f"cp{python_version.replace('.', '')}" if python_version else None
    return any(t.platform.endswith("x86_64") and "linux" in t.platform
               and (want is None or t.interpreter in (want, "py3")) for t in tags)


@dataclass
class ArchAnswer:
    """What the records say about a pin for a site.

    Attributes:
        problems (list[str]): one line per capability a matching wheel does not run on.
        note (str): a line to print when nothing could be checked (no record), else ``""``.
        checked (list[WheelArchs]): the records that matched.
    """

    problems: list = field(default_factory=list)
    note: str = ""
    checked: list = field(default_factory=list)


def check_pin(pin, records: dict[str, WheelArchs], cc_list, python_version: str | None,
              where: str) -> ArchAnswer:
    """Check the wheels of one lock pin that the site would install against its capabilities.

    Args:
        pin (hpcstack.install.lockfile.Pin): the package's pin (its sha256 list).
        records (dict[str, WheelArchs]): known records by sha256.
        cc_list (tuple[int, ...]): the site's compute capabilities.
        python_version (str | None): the site's ``X.Y``; None checks every Linux x86_64 wheel.
        where (str): the record file, named in the note.
    """
    what = f"{pin.name}=={pin.version}"
    matching = [records[h] for h in pin.hashes if h in records and wheel_fits(records[h].file, python_version)]
    if not matching:
        return ArchAnswer(note=f"GPU architectures of {what} not recorded: {where} records none of its "
                               f"wheels for Python {python_version or 'any'} on Linux x86_64; an install "
                               "reads them from the wheel before it writes anything, else from the installed "
                               f"package in its sanity check (record them with hpcstack lock where {pin.index} "
                               "is reachable, or hpcstack lock --gpu-archs-from WHEEL)")
    problems = []
    for rec in matching:
        problems += [p for p in rec.problems(cc_list, what) if p not in problems]
    return ArchAnswer(problems=problems, checked=matching)
