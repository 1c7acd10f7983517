"""The rule of issue 45, enforced: outside :mod:`hpcstack.gate`, no module of ``hpcstack/`` opens,
writes, chmods or chowns, removes, renames, links, makes or execs a path by name, unless the use
is listed here with the category that makes it safe and the reason.

An AST scan of every module under ``hpcstack/`` finds each such call (:data:`CALLS`: ``open``,
``os.open``, ``os.chmod``, ``os.unlink``, ``os.rename``, ``shutil.rmtree``, ``tempfile.mkdtemp``,
``zipfile.ZipFile``, ``sqlite3.connect``, ``os.exec*``…; the helpers of :mod:`hpcstack.fsutil` that act on their
caller's path, counted where they are called; and :data:`METHODS`, the methods of
:class:`pathlib.Path` such as ``write_text``, ``unlink``, ``mkdir``, ``replace``). Starting a
process (``subprocess``) is not in its scope.

Each use must match an entry of :data:`ALLOWLIST` (module, or ``module:function``, and the calls)
in one of the categories below, or of :data:`KNOWN_GAPS`: a use that fits no category (a path an
ordinary user could have touched, used by name as root), with the finding and what would fix it.
An entry that no longer matches any use fails too (stale). ``pytest -s`` prints the counts.

A new file operation goes through :mod:`hpcstack.gate`, or into this list with its category and
reason (docs/admin/security.md, "The rule for contributors").
"""

from __future__ import annotations

import ast
import collections
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

PACKAGE_DIR = REPO / "hpcstack"

#: The module that may do all of it (it is the gate).
GATE = "hpcstack.gate"

# ------------------------------------------------------------------------------ what counts

#: Calls (as imported: ``os.chmod``, ``shutil.rmtree``) that act on a path by name, and what they do.
CALLS = {
    "open": "open", "io.open": "open", "os.open": "open", "tarfile.open": "open", "zipfile.ZipFile": "open",
    "os.chmod": "chmod", "os.lchmod": "chmod", "shutil.copymode": "chmod", "shutil.copystat": "chmod",
    "os.chown": "chown", "os.lchown": "chown", "shutil.chown": "chown",
    "os.unlink": "remove", "os.remove": "remove", "os.rmdir": "remove", "os.removedirs": "remove",
    "shutil.rmtree": "remove",
    "os.rename": "rename", "os.renames": "rename", "os.replace": "rename", "shutil.move": "rename",
    "os.symlink": "link", "os.link": "link",
    "os.mkdir": "make", "os.makedirs": "make", "os.mkfifo": "make", "os.mknod": "make",
    "tempfile.mkstemp": "make", "tempfile.mkdtemp": "make", "tempfile.NamedTemporaryFile": "make",
    "tempfile.TemporaryDirectory": "make", "tempfile.TemporaryFile": "make",
    "os.truncate": "write", "os.utime": "write", "shutil.copy": "write", "shutil.copy2": "write",
    "shutil.copyfile": "write", "shutil.copytree": "write", "shutil.unpack_archive": "write",
    "shutil.make_archive": "write",
    "os.execv": "exec", "os.execve": "exec", "os.execvp": "exec", "os.execvpe": "exec", "os.execl": "exec",
    "os.execle": "exec", "os.execlp": "exec", "os.execlpe": "exec", "os.posix_spawn": "exec",
    "os.posix_spawnp": "exec", "os.spawnv": "exec", "os.spawnve": "exec", "os.spawnvp": "exec",
    "os.spawnvpe": "exec", "os.spawnl": "exec", "os.spawnle": "exec", "os.spawnlp": "exec",
    "os.spawnlpe": "exec",
    # sqlite3 opens (and makes, with its journal) the database by name
    "sqlite3.connect": "open",
    # hpcstack.fsutil acts on its caller's path by name: each call counts where it is made
    "hpcstack.fsutil.write_atomic": "write", "hpcstack.fsutil.sha256_file": "open",
    "hpcstack.fsutil.fsync_dir": "open", "hpcstack.fsutil.fsync_file": "open",
    "hpcstack.fsutil.makedirs_no_follow": "make", "hpcstack.fsutil.open_dir_no_follow": "open",
    "hpcstack.fsutil.write_no_follow": "write", "hpcstack.fsutil.read_no_follow": "open",
}

#: Methods of :class:`pathlib.Path` (and an archive's ``extract``/``extractall``) that act on a path.
METHODS = {
    "write_text": "write", "write_bytes": "write", "read_text": "open", "read_bytes": "open",
    "open": "open", "unlink": "remove", "rmdir": "remove", "mkdir": "make", "touch": "make",
    "chmod": "chmod", "lchmod": "chmod", "rename": "rename", "replace": "rename",
    "symlink_to": "link", "hardlink_to": "link", "extract": "write", "extractall": "write",
}

#: Calls whose result is an archive: its ``.open(member)`` reads a member, not a path.
ARCHIVES = {"zipfile.ZipFile", "tarfile.open", "tarfile.TarFile"}


@dataclass(frozen=True)
class Op:
    """One file operation by name: where (module, function, line) and which call
    (``os.rename``, ``fsutil.write_atomic``, ``.write_text`` for a method)."""

    module: str
    function: str
    line: int
    call: str
    kind: str


def _imports(tree: ast.Module, module: str, is_package: bool = False) -> dict[str, str]:
    """Local name -> what it names (``{"os": "os", "write_atomic": "hpcstack.fsutil.write_atomic"}``),
    from every import in the module, those inside functions included."""
    names = {}
    package = module.split(".") + ([""] if is_package else [])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:      # relative: from the module's package
                base = ".".join(package[:len(package) - node.level] + ([base] if base else []))
            for a in node.names:
                names[a.asname or a.name] = f"{base}.{a.name}"
    return names


def _dotted(func: ast.expr, names: dict[str, str]) -> str | None:
    """``os.path.join`` for ``os.path.join`` (or ``_os.path.join`` after ``import os as _os``);
    None unless it starts at an imported name or is the builtin ``open``."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    if func.id in names:
        return ".".join([names[func.id], *reversed(parts)])
    return "open" if func.id == "open" and not parts else None


def _archives(fn: ast.AST, names: dict[str, str]) -> set[str]:
    """Names bound to an archive in ``fn`` (``with zipfile.ZipFile(w) as zf``, ``tar = tarfile.open(p)``)."""
    bound = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
            if isinstance(node.context_expr, ast.Call) and _dotted(node.context_expr.func, names) in ARCHIVES:
                bound.add(node.optional_vars.id)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            if _dotted(node.value.func, names) in ARCHIVES:
                bound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return bound


def _method(call: ast.Call, names: dict[str, str], archives: set[str]) -> str | None:
    """The kind of a method call on a path (``p.write_text(s)``), or None: not such a method; a
    function of an imported module (``gate.mkdir``, ``dataclasses.replace``); ``str.replace`` (two
    arguments) or ``datetime.replace`` (keywords); ``importlib.metadata``'s ``read_text(name)``;
    an archive member's ``open``."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr not in METHODS:
        return None
    if isinstance(func.value, ast.Name) and func.value.id in names:
        return None
    if func.attr in ("read_text", "read_bytes") and call.args:
        return None
    if func.attr in ("replace", "rename") and (len(call.args) != 1 or call.keywords):
        return None
    if func.attr == "open" and isinstance(func.value, ast.Name) and func.value.id in archives:
        return None
    return METHODS[func.attr]


def scan_source(text: str, module: str, filename: str = "<source>") -> list[Op]:
    """Every file operation by name in the source ``text`` of ``module`` (a package when
    ``filename`` is an ``__init__.py``)."""
    tree = ast.parse(text, filename)
    names = _imports(tree, module, filename.endswith("__init__.py"))
    found: list[Op] = []

    def visit(node: ast.AST, qual: list[str], archives: set[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = archives if isinstance(child, ast.ClassDef) else archives | _archives(child, names)
                visit(child, [*qual, child.name], inner)
                continue
            if isinstance(child, ast.Call):
                dotted = _dotted(child.func, names)
                kind = CALLS.get(dotted) if dotted else None
                if kind is None and dotted and dotted.startswith(("os.exec", "os.spawn", "os.posix_spawn")):
                    kind = "exec"
                call = dotted.removeprefix("hpcstack.") if kind else None
                if kind is None:
                    kind = _method(child, names, archives)
                    call = f".{child.func.attr}" if kind else None
                if kind:
                    found.append(Op(module, ".".join(qual) or "<module>", child.lineno, call, kind))
            visit(child, qual, archives)

    visit(tree, [], _archives(tree, names))
    return found


def module_name(path: Path) -> str:
    """``hpcstack.install.image`` for ``hpcstack/install/image.py`` (a package: its ``__init__``)."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def scan_package(root: Path = PACKAGE_DIR) -> tuple[list[Op], list[str]]:
    """Every file operation by name in every module under ``root``, and the modules scanned."""
    ops, modules = [], []
    for path in sorted(root.rglob("*.py")):
        modules.append(module_name(path))
        ops += scan_source(path.read_text(), modules[-1], str(path))
    return ops, modules


# ------------------------------------------------------------------------------ the categories

PACKAGE = "package data: reads files shipped inside hpcstack (root-owned code)"
CHECKED_INPUT = ("checked input: a recipe's, site config's or repository's file, or an input directory (a bundle, "
                 "--db, a venv, an installed stack read back) that the session's trust check refused unless only "
                 "trusted accounts can change it and every directory above it, as named and as resolved")
CHECKED_DIRS = ("checked dirs: below an install/module/cache/stage root, a kernels directory or an output "
                "directory that trust.check_dirs (or image.check_stage_dir) refused unless only trusted accounts "
                "can change it and every directory above it (the site's stack group included where the site "
                "gives it its directories)")
PRIVATE = ("private stage: a temporary directory this process made (mkdtemp, TemporaryDirectory: new, 0700, "
           "its own) or an unnamed temporary file, and what it puts there")
USER = "user side: runs as the invoking user, never as root (doctor --venv as a user, user venv helpers)"
DESCRIPTOR = "descriptor: operates on a dir_fd/fd it got from the gate (openat, unlinkat with O_NOFOLLOW)"
OWN_WALK = ("own walk: relative to a descriptor of its own walk with O_NOFOLLOW at each component, below a "
            "directory the trust rule checked or from '/' (the gate's discipline written again: to fold into "
            "hpcstack.gate)")
KERNEL = "kernel: /proc, /sys or /dev, which only the kernel provides"
SYSTEM = ("system: a file the system's own configuration names (Slurm's JobCompLoc), written by root or the "
          "Slurm account; read only")
HELPER = ("helper: hpcstack.fsutil acting on its caller's path; each call of it is listed, with its own "
          "category, where it is made")
TEST_HOOK = ("test hook: only with the tests' HPCSTACK_FAILPOINT variable (a path of the test's own), the file "
             "made O_CREAT|O_EXCL|O_NOFOLLOW")

CATEGORIES = (PACKAGE, CHECKED_INPUT, CHECKED_DIRS, PRIVATE, USER, DESCRIPTOR, OWN_WALK, KERNEL, SYSTEM, HELPER,
              TEST_HOOK)


# ------------------------------------------------------------------------------ the uses

#: ``(module or module:function, the calls it makes, category, reason)``. An entry of a function
#: wins over one of its module.
ALLOWLIST = [
    # the command line
    ("hpcstack.cli:main", "os.open", KERNEL,
     "/dev/null, for a closed stdout (BrokenPipeError)"),
    ("hpcstack.cli.export:cmd_export", "open", CHECKED_INPUT,
     "the exporter's extra files: the recipe's patches"),
    ("hpcstack.cli.export:cmd_export", "fsutil.write_atomic", CHECKED_DIRS,
     "-o FILE and its extra files, whose directory session.check_dirs checked first"),
    ("hpcstack.cli.lifecycle:_audit_stack", ".read_text", CHECKED_INPUT,
     "the stack's provenance.json, after session.check_dirs of --stack"),
    # doctor: as root every read below a stack or a module root goes through the gate (read_small,
    # _list_dir: no link, regular files, size cap); by name only for an account on its own files
    ("hpcstack.doctor:_read_plain", "os.open", USER,
     "not root (read_small goes through gate.read_file when euid is 0): the user's own stack records, "
     "O_NONBLOCK, fstat regular, size-capped"),
    # export
    ("hpcstack.export.container:lock_of", ".read_bytes", CHECKED_INPUT, "the recipe's lock file, hashed"),
    # the file utilities: by name on what their callers give them
    ("hpcstack.fsutil", "os.open .mkdir tempfile.mkstemp os.replace os.unlink os.makedirs os.mkdir",
     HELPER, "sha256_file, fsync_dir/_file, write_atomic, and the no-follow walk of *_no_follow"),
    # the install's steps: the download cache, the stage directory, the build (all checked dirs)
    ("hpcstack.install.actions:Fetch.execute", ".mkdir tempfile.mkstemp os.replace os.unlink fsutil.sha256_file",
     CHECKED_DIRS, "the download cache (cache_dir): a new temporary file, sha256 checked, renamed over the name"),
    ("hpcstack.install.actions:WriteFile.execute", "fsutil.fsync_file fsutil.fsync_dir", CHECKED_DIRS,
     "a file of the build it wrote, flushed"),
    ("hpcstack.install.actions:Capture.execute", "fsutil.write_atomic", CHECKED_DIRS,
     "a command's output into the build"),
    ("hpcstack.install.actions:Publish.execute", "fsutil.fsync_dir", CHECKED_DIRS,
     "the install root's directory of the published link, flushed"),
    ("hpcstack.install.actions:check_sha256", "fsutil.sha256_file", CHECKED_DIRS,
     "a download in the cache, or a file an action declares (the recipe's, checked)"),
    ("hpcstack.install.archive", "shutil.rmtree os.unlink os.makedirs tarfile.open .extractall", CHECKED_DIRS,
     "a downloaded archive (sha256 checked) unpacked into the stage directory (tarfile's data filter)"),
    ("hpcstack.install.components.cudawheels:WheelArchCheck._read", "tempfile.TemporaryDirectory", PRIVATE,
     "the wheel downloaded and read there"),
    ("hpcstack.install.components.cudawheels:WheelArchCheck._read", "os.makedirs", CHECKED_DIRS,
     "the site's record <cache_dir>/gpu-archs.json"),
    ("hpcstack.install.components.horovod:CheckBuild.execute", "fsutil.write_atomic", CHECKED_DIRS,
     "check-build.txt in the build's .hpcstack"),
    ("hpcstack.install.components.manifest:WriteSbom.execute", "fsutil.write_atomic", CHECKED_DIRS,
     "the SBOM in the build's .hpcstack"),
    ("hpcstack.install.components.manifest:distribution_files", "open fsutil.sha256_file", CHECKED_DIRS,
     "the RECORD files and installed files of the build's venv, hashed"),
    ("hpcstack.install.components.manifest:_lock_components", "fsutil.sha256_file", CHECKED_INPUT,
     "the recipe's lock file"),
    ("hpcstack.install.components.manifest:_build_components", "fsutil.sha256_file .read_text", CHECKED_INPUT,
     "the recipe's patches"),
    ("hpcstack.install.components.sanity:PythonCheck.execute", "fsutil.write_atomic", CHECKED_DIRS,
     "the sanity check's reports in the build's .hpcstack"),
    ("hpcstack.install.components.source:CachedWheelBuild._prepared_ahead", "open os.unlink", CHECKED_DIRS,
     "the patch step's stamp in the stage directory"),
    ("hpcstack.install.components.source:PrepareAhead.execute", "os.unlink open", CHECKED_DIRS,
     "the patch step's stamp in the stage directory"),
    ("hpcstack.install.components.source:CachedWheelBuild.execute", "shutil.rmtree", CHECKED_DIRS,
     "the build's dist directory in the stage directory (rmtree by descriptor, no link followed)"),
    ("hpcstack.install.components.source:_copy_into", "os.open", DESCRIPTOR,
     "the wheel opened in gate.directory(its directory), copied into the new entry's descriptor"),
    ("hpcstack.install.components.source:_write_new", "os.open", DESCRIPTOR, "O_EXCL|O_NOFOLLOW in the entry's descriptor"),
    ("hpcstack.install.components.source:store_wheels", "os.mkdir os.open os.rename shutil.rmtree os.rmdir",
     DESCRIPTOR, "a new 0700 directory in gate.directory(cache root), renamed into the cache between descriptors"),
    ("hpcstack.install.components.userhelp:_top_level", "open", CHECKED_INPUT, "the recipe's requirements (.in)"),
    ("hpcstack.install.components.wheels:extra_indexes", "open", CHECKED_INPUT, "the recipe's lock file"),
    ("hpcstack.install.gpuarch:read_wheel", "tempfile.TemporaryDirectory .extract", PRIVATE,
     "the wheel's libraries extracted into a new temporary directory"),
    ("hpcstack.install.gpuarch:read_wheel", "zipfile.ZipFile", DESCRIPTOR,
     "lock --gpu-archs-from WHEEL: the zip read from gate.open_file's descriptor (hashed from the same one)"),
    ("hpcstack.install.gpuarch:_unpacked", "os.open", DESCRIPTOR,
     "an unpacked wheel's files: os.fwalk below gate.open_dir's descriptor, O_NOFOLLOW|O_NONBLOCK, fstat regular"),
    ("hpcstack.install.gpuarch:_copy_out", "os.open", PRIVATE,
     "a library copied into read_wheel's temporary directory (O_EXCL|O_NOFOLLOW)"),
    ("hpcstack.install.gpuarch:fatbin_entries", "os.open", PRIVATE,
     "the libraries read_wheel copied or extracted into its temporary directory (O_NOFOLLOW|O_NONBLOCK, "
     "fstat regular)"),
    ("hpcstack.install.gpuarch:download_wheel", "open", PRIVATE, "the requirement file in the caller's temporary directory"),
    ("hpcstack.install.gpuarch:load_records", "open", CHECKED_INPUT,
     "the GPU records beside the recipe's lock, or the site's record in the checked cache_dir"),
    ("hpcstack.install.gpuarch:save_records", "fsutil.write_atomic", CHECKED_INPUT,
     "the GPU records beside the recipe's lock (hpcstack lock), or the site's record in the checked cache_dir"),
    ("hpcstack.install.image:_mount_points", "open", KERNEL, "/proc/self/mountinfo"),
    ("hpcstack.install.image:_venv_at", "os.mkdir", DESCRIPTOR,
     "the build's venv made in the build's gate.open_dir descriptor, then opened O_PATH|O_NOFOLLOW|O_DIRECTORY "
     "relative to it and mounted on through /proc/self/fd/N"),
    ("hpcstack.install.image", "fsutil.fsync_dir os.open os.unlink os.rename os.utime shutil.rmtree open",
     CHECKED_DIRS, "copies in the stage directory that check_stage_dir found root's alone (no link on the way), "
                   "written from the image's gate.open_file descriptor; the image step's own fsync of the build"),
    ("hpcstack.install.layout", ".read_text fsutil.write_atomic os.rename shutil.rmtree os.unlink", CHECKED_DIRS,
     "the stack's state file, builds and default markers in the install and module roots"),
    ("hpcstack.install.lockfile:read_lock", "open", CHECKED_INPUT, "the recipe's lock file"),
    ("hpcstack.install.lockgen:write_lock", "tempfile.TemporaryDirectory .read_text", PRIVATE,
     "uv's output, in a new temporary directory beside the lock"),
    ("hpcstack.install.lockgen:write_lock", ".write_text", CHECKED_INPUT,
     "the lock written into the recipe's directory (hpcstack lock: the checked repository)"),
    ("hpcstack.install.lockgen:record_gpu_archs", "tempfile.TemporaryDirectory", PRIVATE, "the downloaded wheel"),
    ("hpcstack.install.plan:Step.fingerprint", "fsutil.sha256_file", CHECKED_INPUT,
     "the inputs a step's actions declare: the recipe's locks and patches, downloads in the cache"),
    ("hpcstack.install.provenance:record_inputs",
     ".mkdir fsutil.write_atomic shutil.rmtree shutil.copy2 fsutil.sha256_file .read_text", CHECKED_DIRS,
     "the build's .hpcstack, with copies of the recipe's files and the site config (checked inputs)"),
    ("hpcstack.install.provenance:record_timings", ".read_text fsutil.write_atomic", CHECKED_DIRS,
     "timings.json in the build's .hpcstack"),
    ("hpcstack.install.provenance:describe", "os.open", OWN_WALK,
     "hpcstack show DIR: the directory opened once, then only below it by descriptor (.hpcstack, its "
     "records) with O_NOFOLLOW, regular files, size-capped"),
    ("hpcstack.install.provenance:_open_below", "os.open", OWN_WALK, "below describe's descriptor"),
    ("hpcstack.install.provenance:_read_at", "os.open", OWN_WALK, "below describe's descriptor"),
    ("hpcstack.install.records", "os.open os.unlink shutil.rmtree os.rename os.rmdir", OWN_WALK,
     "uninstall and default-marker removal: each root walked from '/' by descriptor, every component "
     "checked (_problem), removed with unlinkat/rmtree(dir_fd=)"),
    ("hpcstack.install.runner", ".read_text .mkdir .unlink os.replace os.open", CHECKED_DIRS,
     "the build's .hpcstack (steps, logs) and the install lock in the install root"),
    ("hpcstack.install.runner:Runner._open_state_file", "fsutil.open_dir_no_follow", OWN_WALK,
     "logs/ and steps/ opened with no link followed from the build's state directory down; the file O_NOFOLLOW "
     "relative to it"),
    ("hpcstack.install.runner:Runner._run_step", "fsutil.open_dir_no_follow os.unlink", OWN_WALK,
     "the step's record: steps/ opened with no link followed from the state directory, its temporary name "
     "unlinked (a link itself), made O_EXCL|O_NOFOLLOW and renamed within that descriptor"),
    ("hpcstack.install.runner:Failpoint.reached", "os.open", TEST_HOOK, "the hold file of a test"),
    ("hpcstack.install.runner:run_actions", "tempfile.TemporaryFile", PRIVATE,
     "a background action's output, an unnamed file"),
    ("hpcstack.install.staged:_read_mountinfo", "open", KERNEL, "/proc/<pid>/mountinfo"),
    ("hpcstack.install.staged:loop_backings", "open os.open", KERNEL,
     "/sys/block/loop*/loop/backing_file and /dev/loop* (LOOP_GET_STATUS64)"),
    ("hpcstack.install.staged:_held_open", "open", KERNEL, "/proc/<pid>/maps"),
    ("hpcstack.install.staged:_remove", "shutil.rmtree os.unlink", CHECKED_DIRS,
     "a stale staged copy in the stage directory (image.check_stage_dir: root's alone, no link on the way)"),
    ("hpcstack.install.wheelcache", "os.open os.mkdir", DESCRIPTOR,
     "the build cache through gate.directory(cache root): the entry, SHA256SUMS and wheels opened O_NOFOLLOW "
     "relative to it, checked by fstat, hashed and copied from those descriptors; dist made in "
     "gate.directory(stage directory), its wheels created O_EXCL|O_NOFOLLOW"),
    # lifecycle
    ("hpcstack.lifecycle.audit:OsvDatabase._read", "open", CHECKED_INPUT,
     "a record of --db DIR (checked), regular file, size-capped"),
    ("hpcstack.lifecycle.audit:stack_packages", ".read_text", CHECKED_INPUT,
     "the stack's SBOM / constraints.txt, after session.check_dirs of --stack"),
    ("hpcstack.lifecycle.audit:run_audit", "fsutil.write_atomic", CHECKED_DIRS,
     "the audit record in the checked stack's .hpcstack"),
    ("hpcstack.lifecycle.bundle:sdist_build_requires", "tarfile.open", CHECKED_DIRS,
     "an sdist the bundle downloaded into its checked output directory (sha256 checked)"),
    ("hpcstack.lifecycle.bundle:make_bundle", ".mkdir shutil.copy2 fsutil.sha256_file fsutil.write_atomic",
     CHECKED_DIRS, "the bundle's output directory (checked), filled from the recipe's checked files"),
    ("hpcstack.lifecycle.bundle:make_bundle", "tempfile.TemporaryDirectory", PRIVATE, "hpcstack's own wheel, built there"),
    ("hpcstack.lifecycle.bundle:read_manifest", "os.open", CHECKED_INPUT,
     "manifest.json of install --from DIR (checked), O_NOFOLLOW, regular file, size-capped"),
    ("hpcstack.lifecycle.bundle:verify_bundle", "os.open", OWN_WALK,
     "the bundle's directory (checked), then each file below it by descriptor (_digest_in)"),
    ("hpcstack.lifecycle.bundle:_digest_in", "os.open", OWN_WALK, "below verify_bundle's descriptor"),
    ("hpcstack.lifecycle.bundle:use_bundle", "fsutil.sha256_file", CHECKED_INPUT, "the recipe's lock file"),
    ("hpcstack.lifecycle.compare:Tree._open", "os.open", OWN_WALK,
     "a compared tree's root (as root: trust-checked), then by descriptor, O_NOFOLLOW, '..' refused"),
    ("hpcstack.lifecycle.compare:_wheel_files", "zipfile.ZipFile", OWN_WALK, "a wheel on Tree._open's descriptor"),
    ("hpcstack.lifecycle.deprecation", ".read_text fsutil.write_atomic .unlink", CHECKED_DIRS,
     "modulefiles, .modulerc and the deprecation record of the module root"),
    ("hpcstack.lifecycle.images:image_reference", "tarfile.open", DESCRIPTOR,
     "an OCI archive argument read from gate.open_file's descriptor (as root: under the trust rule)"),
    ("hpcstack.lifecycle.usage", "os.open os.rmdir", DESCRIPTOR,
     "the usage directory and spool: gate.open_dir, then openat/unlinkat with O_NOFOLLOW, gate.unlink, gate.rmtree"),
    # modules
    ("hpcstack.modules.kernel:make_kernel", ".read_text", CHECKED_INPUT,
     "--venv's bin/activate (the venv checked first: cli.modules._check_venv)"),
    ("hpcstack.modules.kernel", ".read_text .mkdir tempfile.mkdtemp .write_text .chmod os.rename shutil.rmtree",
     CHECKED_DIRS, "the kernels directory, checked by session.check_dirs ('kernels directory')"),
    ("hpcstack.modules.syntax:Tcl._is_modulefile", "os.open", CHECKED_DIRS,
     "a file of a module directory (the module root, or one the site names, checked as the site's code; "
     "the stack group may write it): its directory opened O_DIRECTORY|O_NOFOLLOW (a link at <name> is "
     "refused), the file once relative to it O_NOFOLLOW|O_NONBLOCK, fstat regular, its first 8 bytes "
     "compared; a version link read with readlink and followed (its target opened the same way) only while "
     "it stays inside the module root, as named and resolved: a link to a device or a root-only file, or a "
     "module directory that is a link, is not a modulefile and is never opened"),
    ("hpcstack.modules.writer:available_versions", "os.open", CHECKED_DIRS,
     "<module root>/<name> opened O_DIRECTORY|O_NOFOLLOW and listed by its descriptor: a link there (to "
     "/dev, to a root-only directory) is no module's directory, never listed"),
    ("hpcstack.modules.writer", ".read_text fsutil.write_atomic .unlink", CHECKED_DIRS,
     "hpcstack's default files in the module root"),
    # recipes, configs
    ("hpcstack.recipe", ".read_text", CHECKED_INPUT, "the recipe file, checked before a line of it runs"),
    ("hpcstack.schema:load_yaml", "open", CHECKED_INPUT,
     "site configs and their bases, the system configuration, a recipe's validation file: each checked first"),
    # validation
    ("hpcstack.validate.outdir:chown_tree", "os.open", CHECKED_DIRS,
     "the validation directory validation_dir checked, O_NOFOLLOW, then gate.walk_files"),
    ("hpcstack.validate.outdir:_chown_file", "os.open", DESCRIPTOR, "in a directory of gate.walk_files, O_NOFOLLOW"),
    ("hpcstack.validate.outdir:validation_dir", "tempfile.mkdtemp os.open", CHECKED_DIRS,
     "the directories made with gate.mkdir (parents by mkdirat in checked descriptors); the new <base>-XXXXXX "
     "made by mkdtemp (O_EXCL, 0700) in that checked output root, trust.check_dirs after, then opened "
     "O_NOFOLLOW and fchmod-ed"),
    ("hpcstack.validate.render:write_report", "fsutil.write_no_follow", OWN_WALK,
     "the report in the validation directory (maybe submit_as's): no link followed below it"),
    ("hpcstack.validate.runner", "fsutil.open_dir_no_follow fsutil.makedirs_no_follow fsutil.write_no_follow "
     "fsutil.read_no_follow", OWN_WALK,
     "job directories, scripts, jobs.json below the validation directory: no link followed below it"),
    ("hpcstack.validate.runner:read_records", ".read_text", PRIVATE,
     "the local run's records.jsonl in run_local's temporary directory"),
    ("hpcstack.validate.runner:run_local", "tempfile.TemporaryDirectory", PRIVATE, "the local run's directory"),
    ("hpcstack.validate.scheduler:Slurm.jobcomp_info", ".read_text", SYSTEM, "the jobcomp/filetxt log"),
    ("hpcstack.validate.history:open_history", "os.open", DESCRIPTOR,
     "a new history database O_CREAT|O_EXCL|O_NOFOLLOW in gate.directory's descriptor"),
    ("hpcstack.validate.history:open_history", "sqlite3.connect", CHECKED_DIRS,
     "the history database, by name (and its journal beside it) after gate.open_file checked it and its "
     "directories: safe only while nobody but root and the admin group can change that directory, so "
     "open_history checks it with the stack group removed from the policy (stack_gids), whatever policy it "
     "is given: a history directory the stack group can write is refused, never opened by name"),
    ("hpcstack.validate.status:_matplotlib", "tempfile.mkdtemp", PRIVATE,
     "MPLCONFIGDIR for matplotlib's import (its font cache), new and 0700, removed at exit: no config or "
     "font cache of the caller's environment"),
    ("hpcstack.validate.fingerprint:read_job_fingerprints", "fsutil.read_no_follow", OWN_WALK,
     "each job's fingerprint.json below the validation directory: no link followed below it"),
]

#: Uses that fit no category: a path an ordinary user (or a member of the site's stack group)
#: could have touched, used by name as root. ``(where, calls, finding, what would fix it)``.
KNOWN_GAPS: list = []


# ------------------------------------------------------------------------------ matching

def _entries() -> list[tuple[str, frozenset, str, str]]:
    """Both lists as ``(where, calls, category or "known gap", reason or finding)``."""
    return ([(w, frozenset(c.split()), cat, why) for w, c, cat, why in ALLOWLIST]
            + [(w, frozenset(c.split()), "known gap", finding) for w, c, finding, _ in KNOWN_GAPS])


def _covers(where: str, op: Op) -> int:
    """2: ``where`` names the op's function (or one it is nested in); 1: its module; 0: neither."""
    module, _, function = where.partition(":")
    if module != op.module:
        return 0
    if not function:
        return 1
    return 2 if op.function == function or op.function.startswith(function + ".") else 0


def assign(ops: list[Op]) -> tuple[dict[int, list[Op]], list[Op]]:
    """Each op to the most specific entry (by index in :func:`_entries`) naming its call; and the
    ops that none names."""
    entries = _entries()
    taken: dict[int, list[Op]] = collections.defaultdict(list)
    loose = []
    for op in ops:
        best = max(((_covers(w, op), i) for i, (w, calls, _, _) in enumerate(entries) if op.call in calls),
                   default=(0, -1))
        if best[0]:
            taken[best[1]].append(op)
        else:
            loose.append(op)
    return taken, loose


@pytest.fixture(scope="module")
def scanned() -> tuple[list[Op], list[str]]:
    return scan_package()


def _outside(ops: list[Op]) -> list[Op]:
    return [op for op in ops if op.module != GATE]


# ------------------------------------------------------------------------------ the rule

def test_every_file_operation_outside_the_gate_is_listed(scanned):
    """A file operation by name outside hpcstack/gate.py that no entry names fails, with where it
    is: move it behind hpcstack.gate, or list it with its category and reason."""
    _, loose = assign(_outside(scanned[0]))
    assert loose == [], "file operations by name outside hpcstack.gate, in no ALLOWLIST entry:\n" + "\n".join(
        f"  {op.module}:{op.function}:{op.line} {op.call}" for op in loose)


def stale(ops: list[Op]) -> list[str]:
    """``"<where> <call>"`` of each entry's call that no op of ``ops`` matches there."""
    taken, _ = assign(ops)
    out = []
    for i, (where, calls, _, _) in enumerate(_entries()):
        used = {op.call for op in taken.get(i, [])}
        out += [f"{where} {call}" for call in sorted(calls - used)]
    return out


def test_no_entry_is_stale(scanned):
    """Each call of each entry still matches a use there: an entry whose use moved behind the gate
    (or went) is removed."""
    found = stale(_outside(scanned[0]))
    assert found == [], "entries that match no use any more (remove them):\n  " + "\n  ".join(found)


def test_each_entry_has_a_category_and_a_reason():
    for where, calls, category, reason in ALLOWLIST:
        assert category in CATEGORIES, (where, category)
        assert reason.strip() and calls.split(), where
        assert where.startswith("hpcstack.") and where.split(":")[0] != GATE, where
    for where, calls, finding, fix in KNOWN_GAPS:
        assert finding.strip() and fix.strip() and calls.split(), where
    keys = [(w, c) for w, calls, _, _ in _entries() for c in calls]
    assert len(keys) == len(set(keys)), [k for k, n in collections.Counter(keys).items() if n > 1]


def test_counts(scanned):
    """The numbers (``pytest -s`` prints them): file operations by name and the modules holding
    them, in the gate and outside it; per category; the known gaps."""
    ops, modules = scanned
    outside = _outside(ops)
    taken, _ = assign(outside)
    entries = _entries()
    per_category = collections.Counter()
    for i, found in taken.items():
        per_category[entries[i][2].split(":")[0]] += len(found)
    gaps = [op for i, found in taken.items() if entries[i][2] == "known gap" for op in found]
    lines = [
        f"file rule: {len(modules)} modules scanned; {len(ops)} file operations by name in "
        f"{len({o.module for o in ops})} modules",
        f"  in hpcstack.gate: {len(ops) - len(outside)}",
        f"  outside it: {len(outside)} in {len({o.module for o in outside})} modules, "
        f"{len(ALLOWLIST)} allowlist entries, {len(KNOWN_GAPS)} known gaps",
        *[f"    {n:4d}  {category}" for category, n in per_category.most_common()],
        "  known gaps:",
        *[f"    {op.module}:{op.function}:{op.line} {op.call}" for op in sorted(gaps, key=lambda o: (o.module, o.line))],
    ]
    print("\n" + "\n".join(lines))
    assert len(ops) > len(outside) > 0


# ------------------------------------------------------------------------------ the scan itself

_SAMPLE = '''
import os, shutil, tempfile, zipfile, dataclasses
import os as _os
from pathlib import Path
from hpcstack import gate
from hpcstack.fsutil import write_atomic
from shutil import rmtree as _rm

def f(p, fd, text, site, dist):
    open(p)                              # found
    _os.chmod(p, 0o644)                  # found (an alias of os)
    os.fchmod(fd, 0o644)                 # a descriptor: not a name
    os.stat(p)                           # not an operation
    _rm(p)                               # found (from-import)
    write_atomic(p, text)                # found (fsutil)
    Path(p).write_text(text)             # found
    p.replace(p + ".old")                # found (Path.replace: one argument)
    text.replace("a", "b")               # str.replace
    dataclasses.replace(site, x=1)       # a module's function
    gate.mkdir(p, 0o755)                 # the gate
    gate.unlink(fd, "x")                 # the gate
    dist.read_text("METADATA")           # importlib.metadata: a member name
    tempfile.mkdtemp()                   # found
    with zipfile.ZipFile(p) as zf:       # found
        zf.open("RECORD")                # an archive member
    os.execv(p, [p])                     # found

class C:
    def m(self):
        self.path.unlink()               # found
'''


def test_the_scan_finds_operations_by_name_and_nothing_else():
    """The scan itself (the rule could not fail blind): each operation by name is found, in its
    function, and a descriptor's, a string's, a module's or the gate's call is not."""
    got = [(op.function, op.call) for op in scan_source(_SAMPLE, "hpcstack.sample")]
    assert got == [("f", "open"), ("f", "os.chmod"), ("f", "shutil.rmtree"),
                   ("f", "fsutil.write_atomic"), ("f", ".write_text"), ("f", ".replace"),
                   ("f", "tempfile.mkdtemp"), ("f", "zipfile.ZipFile"), ("f", "os.execv"), ("C.m", ".unlink")], got


def test_an_unlisted_use_and_a_stale_entry_are_both_caught(monkeypatch):
    """Control of the matching: an op no entry names is loose; an entry whose call is not used
    there any more is stale; a function's entry wins over its module's."""
    ops = scan_source("import os\ndef g(p):\n    os.unlink(p)\n", "hpcstack.sample")
    this = sys.modules[__name__]
    monkeypatch.setattr(this, "KNOWN_GAPS", [])
    monkeypatch.setattr(this, "ALLOWLIST", [])
    assert assign(ops)[1] == ops
    monkeypatch.setattr(this, "ALLOWLIST", [("hpcstack.sample", "os.unlink", CHECKED_DIRS, "the module"),
                                            ("hpcstack.sample:g", "os.unlink os.rename", DESCRIPTOR, "g")])
    taken, loose = assign(ops)
    assert loose == [] and dict(taken) == {1: ops}
    assert stale(ops) == ["hpcstack.sample os.unlink", "hpcstack.sample:g os.rename"]
