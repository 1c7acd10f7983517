"""An ordinary user of the login node against the places a red-team review found outside the
trust rule (docs/admin/security.md, boundaries 6 to 9): root's working directory, the
validation's directory and its Slurm jobs, ``doctor``'s venv, ``validate --collect``, the
``hpcstack action`` verbs, ``export -o`` and ``extend-venv-activate``; and the file operations
of issue 45 (a path checked by name, then used again by name): lock files and the build cache
of a group cache, staged copies, a secret's file, a loaded stack's records, the usage spool, a
validation directory given to ``slurm.submit_as``, ``show DIR``.

The account ``rtuser`` (group ``users``; tests/attacker.py) plants its files as a user of a shared
login node can; then root runs the real command, as an admin would. Each test asserts that the
user's code did not run (the canary is absent) or that root's file is unchanged, and, where the
command must refuse, that it refused in one ``error:`` line with exit status 2. Where the claim is
"no canary", a positive control follows: the same payload, started the way a naive tool would
start it (root's plain ``python3`` in that directory, the user's ``module load``, the venv's
python), does write the canary, so the test fails if hpcstack ran it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from attacker import attacker  # noqa: F401
from conftest import HPCSTACK, MODULES_INIT, NEUTRAL_DIR, REPO, make_sdist, write_tiny_recipe

pytestmark = pytest.mark.integration

#: Variables of root's environment that would change what the commands read.
_CLEARED = ("HPCSTACK_PATH", "HPCSTACK_CACHE_DIR", "HPCSTACK_DEBUG", "VIRTUAL_ENV")

#: The recipe whose validation the ``validate`` attacks ask for (built in; refused before its
#: stack is looked for).
VALIDATED = "pytorch/2.3.1-gpu"

VICTIM_TEXT = "root's own file\n"


def hs(*args, cwd: str | os.PathLike = NEUTRAL_DIR, env: dict | None = None) -> subprocess.CompletedProcess:
    """Root runs the real ``hpcstack`` command, in ``cwd``."""
    base = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    return subprocess.run([*HPCSTACK, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env={**base, **(env or {})})


def refused(attacker, proc: subprocess.CompletedProcess, *words: str) -> None:
    """:meth:`Attacker.assert_refused`, and the refusal is exactly one line."""
    attacker.assert_refused(proc, *words)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr


def root_owned(*paths: Path) -> None:
    """Give ``paths`` and everything under them to root, modes 0755/0644."""
    for top in paths:
        for p in [top, *top.rglob("*")]:
            os.chown(p, 0, 0, follow_symlinks=False)
            if not p.is_symlink():
                os.chmod(p, 0o755 if p.is_dir() else 0o644)


@pytest.fixture
def clean_repo(attacker) -> Path:
    """A root-owned repository with the tiny recipe (no payload: root may run it) and a copy of
    the built-in localhost site."""
    root = attacker.shared
    (root / "src").mkdir()
    write_tiny_recipe(root / "repo" / "recipes", make_sdist(root / "src"))
    (root / "repo" / "site-configs").mkdir()
    shutil.copy(REPO / "site-configs" / "localhost.yaml", root / "repo" / "site-configs" / "localhost.yaml")
    root_owned(root / "repo", root / "src")
    return root / "repo"


@pytest.fixture
def jobs_as_root(attacker) -> Path:
    """A root-owned repository whose localhost site submits its jobs as the running account
    (``slurm.submit_as: null``, as on every real site: Cirrus, Perlmutter, JUWELS Booster)."""
    repo = attacker.shared / "repo-val"
    (repo / "site-configs").mkdir(parents=True)
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["slurm"]["submit_as"] = None
    (repo / "site-configs" / "localhost.yaml").write_text(yaml.safe_dump(data))
    root_owned(repo)
    return repo


def victim_file(attacker) -> Path:
    """A root-only file that no command may write or read into a report."""
    victim = attacker.shared / "victim"
    victim.write_text(VICTIM_TEXT)
    victim.chmod(0o600)
    return victim


def victim_dir(attacker) -> Path:
    """A root-only directory (mode 0700)."""
    d = attacker.shared / "victimdir"
    d.mkdir(mode=0o700)
    d.chmod(0o700)
    return d


#: The modules :func:`plant_modules` plants (``pip`` a package, the others ``NAME.py``).
PLANTED = ("venv", "six", "compileall", "platform", "tinypkg", "ensurepip", "json", "pip")


def plant_modules(attacker, where: Path) -> Path:
    """The user's modules in a directory of theirs, each creating the canary when imported:
    what ``python -m venv``/``-m pip``/``-m compileall`` and ``-c "import six, …"`` would find
    first on ``sys.path`` when run there."""
    attacker.mkdir(where)
    for name in PLANTED[:-1]:
        attacker.write(where / f"{name}.py", attacker.payload())
    attacker.mkdir(where / "pip")
    attacker.write(where / "pip" / "__init__.py", attacker.payload())
    attacker.write(where / "pip" / "__main__.py", attacker.payload())
    return where


def assert_planted_modules_run(attacker, where: Path) -> None:
    """The positive control of the tests that find no canary after root ran hpcstack in ``where``:
    root's plain ``python3`` started there, as a naive tool would start it (``-m NAME`` or
    ``-c "import NAME"``: the working directory first on ``sys.path``), runs each planted module,
    which writes the canary. Each is tried alone (the canary removed between); the canary is
    removed at the end."""
    assert not attacker.canary.exists()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH", "PYTHONSTARTUP")}
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    for argv in ([python, "-m", "venv", "--help"], [python, "-m", "pip", "--version"],
                 [python, "-m", "compileall", "--help"], *([python, "-c", f"import {n}"] for n in PLANTED)):
        subprocess.run(argv, capture_output=True, cwd=where, env=env, timeout=120, stdin=subprocess.DEVNULL)
        assert attacker.canary.exists(), f"the planted payload did not run: {' '.join(argv)} in {where}"
        attacker.canary.unlink()


# ---------------------------------------------- 1 (high): Python started in root's working directory

def test_an_install_from_a_directory_holding_the_users_modules_runs_none_of_them(attacker, clean_repo,
                                                                               localhost_ready):
    """The admin ``cd``'d into a user's project directory: ``venv.py``, ``pip/``, ``six.py``,
    ``compileall.py`` there are not imported by the venv, wheels, sanity or install steps."""
    cwd = plant_modules(attacker, attacker.home / "project")
    proc = hs("install", "tiny/1.0", "--site", "localhost", "--repo", clean_repo,
              "--prefix", attacker.shared / "sw", "--module-root", attacker.shared / "mf", cwd=cwd)
    assert not attacker.canary.exists(), f"root ran the user's module from its working directory: {proc.stderr}"
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (attacker.shared / "mf" / "tiny" / "1.0").is_file()
    assert_planted_modules_run(attacker, cwd)


# ---------------------------------- 2 (high): the validation's directory, where root's jobs run

def test_validate_into_an_output_dir_the_user_owns_is_refused(attacker, jobs_as_root):
    """The jobs would run as root from the user's directory: the user could swap ``job.sh``
    before ``sbatch`` reads it, or plant links the status files are written through."""
    out = attacker.mkdir(attacker.home / "val", 0o777)
    attacker.mkdir(out / "n1", 0o777)
    victim = victim_file(attacker)
    attacker.run("ln", "-s", str(victim), str(out / "n1" / "ddp.exit"))
    proc = hs("validate", VALIDATED, "--site", "localhost", "--repo", jobs_as_root, "--output-dir", out,
              "--nodes", "1")
    refused(attacker, proc, "--output-dir", "owned by rtuser")
    assert not (out / "n1" / "job.sh").exists() and not (out / "jobs.json").exists()
    assert victim.read_text() == VICTIM_TEXT


# --------------------------------------- 4 (medium): a link planted at the validation's directory

def test_validate_through_a_link_planted_at_the_output_dir_changes_no_mode(attacker, jobs_as_root):
    target = victim_dir(attacker)
    link = attacker.home / "val"
    attacker.run("ln", "-s", str(target), str(link))
    proc = hs("validate", VALIDATED, "--site", "localhost", "--repo", jobs_as_root, "--output-dir", link,
              "--nodes", "1")
    refused(attacker, proc, "--output-dir", "owned by rtuser")
    assert target.stat().st_mode & 0o777 == 0o700
    assert list(target.iterdir()) == []


# ------------------------------------------------------------------ 3 (high): doctor's venv

def users_venv(attacker) -> Path:
    """A venv of the user's whose ``.pth`` file creates the canary when its python starts (checked:
    the user starts it once, and the canary it writes is removed)."""
    venv = attacker.home / "venv"
    attacker.run("python3", "-m", "venv", "--without-pip", str(venv))
    site = next(venv.glob("lib/python*/site-packages"))
    attacker.write(site / "evil.pth", attacker.payload())
    attacker.run(str(venv / "bin" / "python"), "-c", "pass")
    assert attacker.canary.exists(), "the venv's .pth payload did not run when its python started"
    attacker.canary.unlink()
    return venv


@pytest.fixture
def roots_stack(attacker) -> Path:
    """A root-owned stand-in for a stack prefix: ``venv/`` and an empty ``.hpcstack/``."""
    prefix = attacker.shared / "stack"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(prefix / "venv")], check=True, cwd="/")
    (prefix / ".hpcstack").mkdir()
    return prefix


def test_doctor_refuses_to_run_the_python_of_a_users_venv(attacker, roots_stack):
    venv = users_venv(attacker)
    proc = hs("doctor", "--venv", venv, "--stack", roots_stack)
    refused(attacker, proc, "--venv", "owned by rtuser", "hpcstack doctor")


def test_doctor_of_the_active_venv_of_a_user_is_refused_too(attacker, roots_stack):
    """``VIRTUAL_ENV`` left by a user's shell (``sudo -E``) counts as ``--venv``."""
    venv = users_venv(attacker)
    proc = hs("doctor", "--stack", roots_stack, env={"VIRTUAL_ENV": str(venv)})
    refused(attacker, proc, "owned by rtuser")


def test_doctor_from_a_directory_holding_the_users_modules_runs_none_of_them(attacker, roots_stack):
    """``platform.py``, ``json.py`` in root's working directory: the stack's python probe runs in
    ``/`` with ``-I``."""
    cwd = plant_modules(attacker, attacker.home / "project")
    proc = hs("doctor", "--stack", roots_stack, cwd=cwd)
    assert not attacker.canary.exists(), proc.stderr
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    assert_planted_modules_run(attacker, cwd)


def _doctor_as_root(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` (with ``doctor`` imported) as root in a child with a deadline: a FIFO opened
    by name would block it for ever."""
    return subprocess.run([sys.executable, "-c", "from hpcstack import doctor\n" + code], capture_output=True,
                          text=True, timeout=30, cwd="/", env={**os.environ, "PYTHONPATH": str(REPO)})


def test_doctor_as_root_reads_no_fifo_and_no_link_in_a_users_stack(attacker):
    """A user's stack whose ``provenance.json`` is a FIFO, whose ``constraints.txt`` is a link to a
    root-only file and whose ``METADATA`` is a FIFO: doctor as root neither blocks nor reads
    through the link (the gate: regular files only, no link on the way)."""
    secret = attacker.shared / "secret.txt"
    secret.write_text("rootonly-pin==1.0\n")
    secret.chmod(0o600)
    stack = attacker.mkdir(attacker.home / "stack")
    state = attacker.mkdir(stack / ".hpcstack")
    attacker.run("mkfifo", str(state / "provenance.json"))
    attacker.run("ln", "-s", str(secret), str(state / "constraints.txt"))
    dist = attacker.mkdir(stack / "venv" / "lib" / "python3.11" / "site-packages" / "x-1.0.dist-info")
    attacker.run("mkfifo", str(dist / "METADATA"))
    proc = _doctor_as_root(f"print(doctor.deprecated_stack_lines([{str(stack)!r}]), doctor.stack_version_lines("
                           f"[{str(stack)!r}]), doctor.read_constraints(__import__('pathlib').Path({str(stack)!r})), "
                           f"doctor.distributions([{str(dist.parent)!r}]))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[] [] ([], '') {}", proc.stdout


def test_doctor_as_root_lists_no_directory_a_users_record_names(attacker):
    """The user's ``provenance.json`` names a modulefile in a root-only 0700 directory: root's
    doctor neither lists it nor reads its default files (a file name from there used to be
    printed); one line says the record was not read."""
    private = attacker.shared / "private" / "tool"
    private.mkdir(parents=True)
    (private / "9.9-secret-name").write_text("#%Module\n")
    (attacker.shared / "private").chmod(0o700)
    stack = attacker.mkdir(attacker.home / "stack")
    state = attacker.mkdir(stack / ".hpcstack")
    attacker.write(state / "provenance.json", json.dumps({"modulefile": str(private / "1.0")}))
    proc = _doctor_as_root(f"print(doctor.deprecated_stack_lines([{str(stack)!r}], {{}})); "
                           f"print(doctor.stack_version_lines([{str(stack)!r}], {{}}))")
    assert proc.returncode == 0, proc.stderr
    assert "secret-name" not in proc.stdout, proc.stdout
    lines = proc.stdout.splitlines()
    assert "outside the stack and the trusted module roots on MODULEPATH: not read" in lines[0], lines
    assert lines[1] == "[]", lines
    # a module root on MODULEPATH that passes the rule is read
    proc = _doctor_as_root(f"print(doctor.stack_version_lines([{str(stack)!r}], "
                           f"{{'MODULEPATH': {str(private.parent)!r}}}))")
    assert "9.9-secret-name" in proc.stdout, proc


# ------------------------------------------- 5 (medium) and 6 (low): validate --collect DIR

def jobs_json(job_dir: str, **job) -> str:
    return json.dumps({"site": "localhost", "recipe": VALIDATED, "partition": "debug", "scheduler": "slurm",
                       "settings": {}, "jobs": [{"job_id": "1", "nodes": 1, "ranks": 1, "backends": ["ddp"],
                                                 "directory": job_dir, **job}]})


def test_collect_from_a_directory_the_user_owns_reads_nothing_of_roots(attacker):
    """The user's ``jobs.json`` names a job whose output would be a root-only file."""
    victim = victim_file(attacker)
    col = attacker.mkdir(attacker.home / "col")
    attacker.mkdir(col / "n1")
    attacker.run("ln", "-s", str(victim), str(col / "n1" / "slurm-1.out"))
    attacker.write(col / "jobs.json", jobs_json(str(col / "n1")))
    proc = hs("validate", VALIDATED, "--site", "localhost", "--collect", col)
    refused(attacker, proc, "--collect", "owned by rtuser")
    assert VICTIM_TEXT.strip() not in proc.stdout + proc.stderr
    assert not (col / "report.json").exists()


@pytest.mark.parametrize("case", ["wrong types", "a directory outside"])
def test_collect_with_a_jobs_file_of_the_wrong_shape_is_one_line(attacker, case):
    """A ``jobs.json`` root keeps (a root-owned validation directory) but of the wrong types, or
    naming a job directory elsewhere: one line, exit 2, no internal error, nothing read there."""
    victim = victim_file(attacker)
    col = attacker.shared / "col"
    (col / "n1").mkdir(parents=True)
    if case == "wrong types":
        text = json.dumps({"site": "localhost", "recipe": VALIDATED, "jobs": [1]})
    else:
        (attacker.shared / "elsewhere").mkdir()
        os.symlink(victim, attacker.shared / "elsewhere" / "slurm-1.out")
        text = jobs_json(str(attacker.shared / "elsewhere"))
    (col / "jobs.json").write_text(text)
    root_owned(col)
    proc = hs("validate", VALIDATED, "--site", "localhost", "--collect", col)
    refused(attacker, proc, "jobs.json")
    assert VICTIM_TEXT.strip() not in proc.stdout + proc.stderr


# ------------------------------------------------------------ 7 (low): hpcstack action verbs

def test_action_unpack_into_a_directory_under_the_users_link_is_refused(attacker):
    """The dry-run script is run later than it was printed: ``unpack`` empties DEST first, and a
    link the user planted above it would point that at root's directory."""
    target = victim_dir(attacker)
    (target / "keep").write_text(VICTIM_TEXT)
    archive = attacker.shared / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("pkg/file")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"x\n"))
    stage = attacker.mkdir(attacker.home / "stage")
    attacker.run("ln", "-s", str(target), str(stage / "src"))
    proc = hs("action", "unpack", archive, stage / "src" / "tinypkg")
    refused(attacker, proc, "hpcstack action unpack DEST", "owned by rtuser")
    assert sorted(p.name for p in target.iterdir()) == ["keep"]
    assert (target / "keep").read_text() == VICTIM_TEXT


# ---------------------------------------------------------------- 8 (low): export -o FILE

def test_export_into_a_directory_the_user_linked_elsewhere_is_refused(attacker, clean_repo):
    target = victim_dir(attacker)
    link = attacker.home / "exp"
    attacker.run("ln", "-s", str(target), str(link))
    proc = hs("export", "tiny/1.0", "--site", "localhost", "--repo", clean_repo, "--format", "json",
              "-o", link / "plan.json")
    refused(attacker, proc, "-o", "owned by rtuser")
    assert list(target.iterdir()) == []


# ----------------------------------------------- 9 (low): extend-venv-activate on another's venv

def test_extend_venv_activate_by_root_on_a_users_venv_is_refused(attacker):
    from hpcstack.modules.activate import render_extend_venv_activate

    venv = users_venv(attacker)
    before = (venv / "bin" / "activate").read_bytes()
    tool = attacker.shared / "extend-venv-activate"
    tool.write_text(render_extend_venv_activate("tiny/1.0", {}, sys.executable))
    tool.chmod(0o755)
    proc = subprocess.run([str(tool), str(venv)], capture_output=True, text=True, cwd="/", timeout=120)
    assert not attacker.canary.exists(), proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "rtuser" in errors[0], proc.stderr
    assert (venv / "bin" / "activate").read_bytes() == before


def test_extend_venv_activate_by_root_through_a_directory_the_user_controls_is_refused(attacker):
    """Root's own venv, named through a directory the user owns (where a link of theirs can
    point at another root-owned venv, or be flipped to their own between the check and the run):
    refused with one line naming the user, nothing changed; the same venv by its own path is
    extended (the positive control: the refusal is the path, not the venv)."""
    from hpcstack.modules.activate import render_extend_venv_activate

    venv = attacker.shared / "rootvenv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    via = attacker.mkdir(attacker.home / "via")
    os.symlink(venv, via / "v")          # root made the link here: only the directory is the user's
    before = (venv / "bin" / "activate").read_bytes()
    tool = attacker.shared / "extend-venv-activate"
    tool.write_text(render_extend_venv_activate("tiny/1.0", {}, sys.executable))
    tool.chmod(0o755)
    proc = subprocess.run([str(tool), str(via / "v")], capture_output=True, text=True, cwd="/", timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "rtuser" in errors[0] and str(via) in errors[0], proc.stderr
    assert (venv / "bin" / "activate").read_bytes() == before
    good = subprocess.run([str(tool), str(venv)], capture_output=True, text=True, cwd="/", timeout=120)
    assert good.returncode == 0, good.stderr
    assert (venv / "bin" / "activate").read_bytes() != before


@pytest.mark.parametrize("planted", ["use", "child"])
def test_a_module_directory_of_the_site_that_the_user_made_first_is_refused(attacker, planted):
    """A site config (root's) lists a module directory in ``modules.use`` that the user created
    first (``use``), or that root made but in which the user owns the directory of a module
    (``child``): root's ``install --dry-run`` would ``module load python`` from it and run the
    user's modulefile (Tcl ``exec``). The site's module directories are checked as its file is."""
    mods = attacker.shared / "usermods" if planted == "child" else Path(f"/tmp/hpcstack-usermods-{attacker.shared.name}")
    try:
        if planted == "child":
            mods.mkdir()  # root's, mode 0755; the user's module directory inside it
        else:
            attacker.mkdir(mods)  # the user's, made before root's site names it
        attacker.mkdir(mods / "python")
        attacker.write(mods / "python" / "99.0", f"#%Module\nexec sh -c {{{attacker.shell_payload()}}}\n")
        site = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
        site["modules"]["use"] = ["/opt/hpcstack/base-modulefiles", str(mods)]
        site["modules"]["base"] = "python/99.0"
        (attacker.shared / "site.yaml").write_text(yaml.safe_dump(site))
        recipe = write_tiny_recipe(attacker.shared / "recipes", make_sdist(attacker.shared))
        root_owned(attacker.shared / "recipes", attacker.shared / "site.yaml")
        proc = hs("install", recipe, "--site", attacker.shared / "site.yaml", "--prefix", attacker.shared / "sw",
                  "--module-root", attacker.shared / "mf", "--dry-run")
        refused(attacker, proc, "owned by rtuser")
        # the positive control: the same modulefile loaded as module tools load it (the user's
        # own `module use DIR; module load python/99.0`) runs its payload
        load = attacker.run("bash", "--norc", "--noprofile", "-c",
                            f"source {MODULES_INIT} && module use {mods} && module load python/99.0", check=False)
        assert attacker.canary.exists(), f"loading the planted modulefile ran nothing: {load.stdout}{load.stderr}"
    finally:
        shutil.rmtree(mods, ignore_errors=True)


# ------------------------------------------------------------------ root's file operations by name
#
# The places where root checked a path by name and then used it again by name (hpcstack/gate.py,
# docs/admin/security.md "The gate"): the user's files and mounts are real; root calls the
# product's functions directly (what the installed command runs), each time after a positive
# control that shows the same move against the operation by name.

def _as_user(attacker, *argv: str) -> subprocess.Popen:
    """Start ``argv`` as the user, with a plain environment; its standard input is a pipe."""
    return subprocess.Popen(["runuser", "-u", attacker.name, "--", "env", "-i", f"HOME={attacker.home}",
                             "PATH=/usr/local/bin:/usr/bin:/bin", *argv],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=attacker.home)


def _held(command: str) -> str:
    """A shell script: ``command``, then ``ready``, then hold (the mounts with it) until its input closes."""
    return f"{command} && echo ready && exec cat >/dev/null"


def _group_cache(attacker) -> Path:
    """A cache directory of root's that the user's group may write (``permissions.group`` with
    ``g+rwX``: the site's stack group), as hpcstack makes it for such a site (mode 2770)."""
    cache = attacker.shared / "cache"
    cache.mkdir()
    os.chown(cache, 0, attacker.gid)
    cache.chmod(0o2770)
    return cache


def _victim_file(attacker) -> Path:
    victim = attacker.shared / "victim"
    victim.write_text(VICTIM_TEXT)
    victim.chmod(0o600)
    return victim


_SWAP_LOCK = """
import os, sys, time
cache, victim, stop = sys.argv[1:4]
lock, n = os.path.join(cache, "x.lock"), 0
print("ready", flush=True)
while not os.path.exists(stop):
    n += 1
    os.symlink(victim, os.path.join(cache, f".l{n}"))
    os.rename(os.path.join(cache, f".l{n}"), lock)
    fd = os.open(os.path.join(cache, f".f{n}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    os.fchmod(fd, 0o666)
    os.close(fd)
    os.rename(os.path.join(cache, f".f{n}"), lock)
os.symlink(victim, os.path.join(cache, ".last"))
os.rename(os.path.join(cache, ".last"), lock)
print(n, flush=True)
"""


def test_tightening_lock_files_in_a_group_cache_changes_no_file_a_member_links_in(attacker):
    """A member of the site's stack group swaps uv's ``x.lock`` in the group-writable cache for a
    link to root's file, back and forth, while root takes group and other write off the cache's
    lock files after an install (:func:`hpcstack.install.service.tighten_lock_files`): root's file
    keeps its mode, the lock files are still tightened. Positive control: ``chmod`` by name (what
    the install did, after an ``lstat``) through the link makes root's file 0755."""
    import stat
    import time

    from hpcstack import trust
    from hpcstack.install.service import tighten_lock_files

    cache, victim = _group_cache(attacker), _victim_file(attacker)
    stop = attacker.shared / "stop"
    pol = trust.Policy(uid=0, stack_gids=frozenset({attacker.gid}))
    swapper = _as_user(attacker, "python3", "-c", _SWAP_LOCK, str(cache), str(victim), str(stop))
    changed = 0
    try:
        assert swapper.stdout.readline() == "ready\n", swapper.stderr.read()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            changed += tighten_lock_files([str(cache)], pol)
            assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    finally:
        stop.touch()
        out, err = swapper.communicate(timeout=60)
    assert swapper.returncode == 0 and int(out.split()[-1]) > 0, err
    assert changed > 0, "no lock file was tightened: the test did not run against the swaps"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600 and victim.read_text() == VICTIM_TEXT
    assert (cache / "x.lock").is_symlink()
    # the positive control: by name, through the link the member left
    os.chmod(cache / "x.lock", 0o755)
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755


_SWAP_NEW = """
import os, sys
cache, target, stop = sys.argv[1:4]
n = 0
print("ready", flush=True)
while not os.path.exists(stop):
    for name in os.listdir(cache):
        if name.startswith(".new-"):
            try:
                os.rename(os.path.join(cache, name), os.path.join(cache, f".moved-{n}"))
                os.symlink(target, os.path.join(cache, name))
                n += 1
            except OSError:
                pass
print(n, flush=True)
"""


def test_storing_a_built_wheel_in_a_group_cache_writes_nothing_through_a_members_link(attacker):
    """A member of the site's stack group renames root's new cache entries (``.new-*``) aside and
    puts links to a directory of root's in their place, while root stores built wheels there
    (:func:`hpcstack.install.components.source.store_wheels`): nothing lands in root's directory,
    its mode is kept, and what is stored is root's wheel with its sha256. Positive control: the
    copy by name that the store did (``shutil.copy`` into the entry's name) writes into root's
    directory through such a link."""
    import stat

    from hpcstack import gate, trust
    from hpcstack.errors import HpcstackError
    from hpcstack.install import wheelcache
    from hpcstack.install.components.source import store_wheels

    cache = _group_cache(attacker)
    target = attacker.shared / "roots-dir"
    target.mkdir(mode=0o700)
    dist = attacker.shared / "dist"
    dist.mkdir()
    wheel = dist / "tinypkg-1.0-py3-none-any.whl"
    wheel.write_bytes(b"root's wheel\n" * 1000)
    stop = attacker.shared / "stop"
    swapper = _as_user(attacker, "python3", "-c", _SWAP_NEW, str(cache), str(target), str(stop))
    stored = failed = 0
    pol = trust.Policy(uid=0, stack_gids=frozenset({attacker.gid}))     # the install's: the stack group too
    try:
        assert swapper.stdout.readline() == "ready\n", swapper.stderr.read()
        with gate.trusting(pol):
            for i in range(300):
                try:
                    store_wheels(str(cache), f"key{i}", [str(wheel)], "the key's text\n")
                    stored += 1
                except (OSError, HpcstackError):
                    failed += 1
    finally:
        stop.touch()
        out, err = swapper.communicate(timeout=60)
    assert swapper.returncode == 0, err
    assert list(target.iterdir()) == [] and stat.S_IMODE(target.stat().st_mode) == 0o700
    assert stored > 0, f"nothing stored ({failed} failed)"
    for entry in cache.glob("key*"):
        wheels, problem = wheelcache.check_entry(str(entry), pol)
        assert problem is None and [Path(w).read_bytes() for w in wheels] == [wheel.read_bytes()], problem
    # the positive control: the copy by name into a name the member linked
    (cache / ".new-control").symlink_to(target)
    shutil.copy(wheel, cache / ".new-control")
    assert [p.name for p in target.iterdir()] == [wheel.name]


def _staged_stale_tree(root: Path):
    """A stack ``tiny/1.0`` under ``root/sw`` with one build, not published, and its unpacked copy
    staged by hand in a root-owned 0700 ``root/stage`` (as ``mount --stage DIR --unpack`` leaves
    it): a stale copy that prune removes unless something uses it. Returns (layout, stage, tree)."""
    from hpcstack.install import image
    from hpcstack.install.layout import StackLayout

    build = root / "sw" / "tiny" / ".1.0-aaaaaaaaaaaa"
    (build / "venv").mkdir(parents=True)
    stage = root / "stage"
    stage.mkdir(mode=0o700)
    tree = Path(image.staged_tree_of(str(build), str(stage)))
    (tree / "bin").mkdir(parents=True)
    (tree / "pyvenv.cfg").write_text("home = /usr/bin\n")
    Path(str(tree) + ".done").write_text("staged\n")
    return StackLayout(str(root / "sw"), "tiny", "1.0"), stage, tree


@pytest.mark.parametrize("how", ["bind", "mount inside"])
def test_a_users_own_mount_namespace_keeps_no_staged_copy_alive(attacker, how):
    """The user, in a user and mount namespace of their own (``unshare -Urm``), binds a directory
    of theirs that has the name of a stale staged tree (``bind``), or mounts a tmpfs over the stage
    directory and another on the tree's name in it (``mount inside``): prune still removes the
    copy (5.5 GB of a node's memory for a real stack). Positive controls: the rule by name that
    prune used (a bind whose root holds the tree's name on the copy's file system; a mount point at
    the tree's path) matches the user's mount; and root binding the real tree in a namespace of its
    own does keep the copy."""
    from hpcstack.install import staged

    layout, stage, tree = _staged_stale_tree(attacker.shared)
    # root's own bind of the real copy in a private namespace (a job's): kept
    point = attacker.shared / "job-view"
    point.mkdir()
    job = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                            _held(f"mount --bind {tree} {point}")],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert job.stdout.readline() == "ready\n"
        report = staged.prune(layout, str(stage))
        kept = {p.path: p.why for p in report.kept}
        assert kept.get(str(tree), "").startswith(f"bound at {point} (mount namespace of pid "), report
    finally:
        job.stdin.close()
        assert job.wait(timeout=60) == 0
    # the user's look-alike, on the copy's file system
    theirs = attacker.mkdir(attacker.shared / "users" / tree.name)
    view = attacker.mkdir(attacker.shared / "users" / "view")
    assert os.stat(theirs).st_dev == os.stat(tree).st_dev
    command = (f"mount --bind {theirs} {view}" if how == "bind" else
               f"mount -t tmpfs none {stage} && mkdir {tree} && mount -t tmpfs none {tree}")
    hold = _as_user(attacker, "unshare", "-Urm", "sh", "-c", _held(command))
    try:
        assert hold.stdout.readline() == "ready\n", hold.stderr.read()
        mounts = staged.node_mounts()
        dev = (os.major(tree.stat().st_dev), os.minor(tree.stat().st_dev))
        theirs_seen = [m for m in mounts if m.pid is not None and (
            (m.dev == dev and tree.name in m.root.split("/")) if how == "bind" else m.point == str(tree))]
        assert theirs_seen, "the user's mount is not in sight: the attack was not made"   # the rule by name matched it

        report = staged.prune(layout, str(stage))

        assert [p.path for p in report.removed] == [str(tree)], report
        assert not tree.exists() and not Path(str(tree) + ".done").exists()
    finally:
        hold.stdin.close()
        hold.wait(timeout=60)


# ------------------------------------------------------------------ issue 45, the low findings
#
# Root read or removed by name what a user could change or swap: a secret's file, the records a
# loaded module's variable names, a directory the user made in the usage spool, the records of a
# validation directory handed to slurm.submit_as, a link at a stack's .hpcstack.

def test_a_secret_file_the_user_can_change_is_refused_before_anything_runs(attacker, clean_repo,
                                                                          localhost_ready):
    """The site (root's) reads ``BASH_ENV`` from a file the user owns: its first line names the
    user's script, which every bash of the install would run as root. The install refuses it in
    one line naming the file and whose it is, exit 2, and makes nothing. Positive control: the
    file read by name, as the install read it, and given to a bash as the install's steps get
    their environment, runs the user's script."""
    script = attacker.write(attacker.home / "evil.sh", attacker.shell_payload() + "\n", 0o755)
    token = attacker.write(attacker.home / "token", f"{script}\n", 0o600)
    site = clean_repo / "site-configs" / "localhost.yaml"
    data = yaml.safe_load(site.read_text())
    data.setdefault("build", {}).setdefault("env", {})["BASH_ENV"] = {"secret": True, "from_file": str(token)}
    site.write_text(yaml.safe_dump(data))
    proc = hs("install", "tiny/1.0", "--site", "localhost", "--repo", clean_repo,
              "--prefix", attacker.shared / "sw", "--module-root", attacker.shared / "mf")
    refused(attacker, proc, f"build.env.BASH_ENV: the secret's file {token}: owned by {attacker.name}")
    assert not (attacker.shared / "sw").exists() and not (attacker.shared / "mf").exists()
    # the positive control: read by name, and handed to a bash as a step's environment
    with open(token, encoding="utf-8") as f:
        value = f.readline().rstrip("\n")
    subprocess.run(["bash", "-c", "true"], env={**os.environ, "BASH_ENV": value}, cwd="/", timeout=60)
    assert attacker.canary.exists(), "the user's BASH_ENV did not run: the test cannot fail"


def test_the_site_a_users_loaded_module_records_is_not_read_by_root(attacker, clean_repo):
    """``hpcstack kernel install tiny/1.0`` without ``--site``, run by root in a shell where the
    user's module set ``HPCSTACK_TINY_ROOT`` to a stack of theirs: its ``site.json`` names the
    user's module root, which the kernel (in everyone who starts it) would load modules from.
    The command, and :func:`hpcstack.modules.kernel.recorded_site` that it asks, refuse it in one
    line (owned by the user), and no kernel is written. Positive control: read by name (as the
    inference read it), the record leads to the user's modulefile, whose load runs the payload."""
    from hpcstack import trust
    from hpcstack.errors import ConfigError
    from hpcstack.modules import kernel

    top = attacker.mkdir(attacker.home / "sw" / "tiny")
    state = attacker.mkdir(top / ".1.0-abc" / ".hpcstack")
    mods = attacker.mkdir(attacker.home / "mf" / "tiny")
    attacker.write(mods / "1.0", f"#%Module\nputs stdout {{{attacker.shell_payload()};}}\n")
    attacker.write(state / "provenance.json", json.dumps({"site": {"name": "localhost", "file": "/x.yaml"}}))
    attacker.write(state / "site.json", json.dumps({"install_root": str(attacker.home / "sw"),
                                                    "module_root": str(mods.parent)}))
    attacker.run("ln", "-s", ".1.0-abc", str(top / "1.0"))
    with pytest.raises(ConfigError) as exc:
        kernel.recorded_site("HPCSTACK_TINY_ROOT", str(top / "1.0"), "1.0", ["localhost"], trust.Policy(uid=0))
    [line] = exc.value.lines()
    assert line.startswith(f"HPCSTACK_TINY_ROOT={top / '1.0'}: ") and f"owned by {attacker.name}" in line
    proc = hs("kernel", "install", "tiny/1.0", "--repo", clean_repo, "--prefix", attacker.shared / "k",
              env={"HPCSTACK_TINY_ROOT": str(top / "1.0")})
    refused(attacker, proc, f"HPCSTACK_TINY_ROOT={top / '1.0'}: ", f"owned by {attacker.name}")
    assert not (attacker.shared / "k").exists()
    # the positive control: the record read by name names the user's module root, and a load from it runs
    with open(top / "1.0" / ".hpcstack" / "site.json") as f:
        module_root = json.load(f)["module_root"]
    attacker.run("bash", "--norc", "--noprofile", "-c",
                 f"source {MODULES_INIT} && module use {module_root} && module load tiny/1.0", check=False)
    assert attacker.canary.exists(), "the user's modulefile ran nothing: the test cannot fail"


def _usage_spool(attacker):
    """A usage directory as ``module usage-hook install`` makes it (root's 0755, spool 1733)."""
    from hpcstack.lifecycle import usage

    cfg = usage.UsageConfig(str(attacker.shared / "usage"))
    cfg.spool.mkdir(parents=True)
    cfg.spool.chmod(0o1733)
    (attacker.shared / "usage").chmod(0o755)
    return cfg


_SWAP_SPOOL = """
import os, sys
spool, target, stop = sys.argv[1:4]
n = 0
print("ready", flush=True)
while not os.path.exists(stop):
    n += 1
    mine = os.path.join(spool, f"u{n % 50}")
    try:
        os.makedirs(os.path.join(mine, "sub"), exist_ok=True)
        open(os.path.join(mine, "sub", "f"), "w").close()
        os.rename(os.path.join(mine, "sub"), os.path.join(mine, "away"))
        os.symlink(target, os.path.join(mine, "sub"))
        os.unlink(os.path.join(mine, "sub"))
        os.rename(os.path.join(mine, "away"), os.path.join(mine, "sub"))
    except OSError:
        pass
print(n, flush=True)
"""


def test_a_users_directories_in_the_usage_spool_go_and_no_link_in_them_is_followed(attacker):
    """The user makes directories in the world-writable spool (a directory is never an event):
    they were kept forever. Now collection removes them (older than a day here: ``now`` a week
    on), while the user swaps a directory in them for a link to root's directory, 300 times:
    root's files stay, and when the user stops, nothing of theirs is left in the spool. Positive
    control: a sweep by name that follows links (``os.walk(followlinks=True)`` then ``unlink``)
    removes root's file through the same link."""
    import time

    from hpcstack.lifecycle import usage

    cfg = _usage_spool(attacker)
    roots = victim_dir(attacker)
    (roots / "keep").write_text(VICTIM_TEXT)
    attacker.sh(f"mkdir -p {cfg.spool}/static/sub && ln -s {roots} {cfg.spool}/static/to-dir && "
                f"ln -s {roots / 'keep'} {cfg.spool}/static/sub/to-file && mkdir {cfg.spool}/empty")
    later = time.time() + 7 * 86400
    done = usage.collect(cfg, later)
    assert done.swept == 2 and list(cfg.spool.iterdir()) == []
    stop = attacker.shared / "stop"
    swapper = _as_user(attacker, "python3", "-c", _SWAP_SPOOL, str(cfg.spool), str(roots), str(stop))
    swept = 0
    try:
        assert swapper.stdout.readline() == "ready\n", swapper.stderr.read()
        for _ in range(300):
            swept += usage.collect(cfg, later).swept
            assert sorted(p.name for p in roots.iterdir()) == ["keep"]
    finally:
        stop.touch()
        out, err = swapper.communicate(timeout=60)
    assert swapper.returncode == 0 and int(out.split()[-1]) > 0, err
    assert swept > 0, "no directory of the user's was removed: the test did not run against the swaps"
    assert (roots / "keep").read_text() == VICTIM_TEXT
    usage.collect(cfg, later)
    assert list(cfg.spool.iterdir()) == [], "the user's directories are kept"
    # the positive control: a sweep by name that follows the user's link
    attacker.sh(f"mkdir {cfg.spool}/ctl && ln -s {roots} {cfg.spool}/ctl/sub")
    for top, _, files in os.walk(cfg.spool / "ctl", followlinks=True):
        for name in files:
            os.unlink(os.path.join(top, name))
    assert not (roots / "keep").exists()


_SWAP_JOB_DIR = """
import os, sys, time
out, target, stop = sys.argv[1:4]
job, away, n = os.path.join(out, "n1"), os.path.join(out, "n1.away"), 0
print("ready", flush=True)
while not os.path.exists(stop):
    n += 1
    try:
        for name in ("roots.jsonl", "roots.exit"):     # the names of root's files, in the real n1
            open(os.path.join(job, name), "w").close()
        os.rename(job, away)
        os.symlink(target, job)
        time.sleep(0.0002)
        os.unlink(job)
        os.rename(away, job)
        time.sleep(0.0002)
    except OSError:
        pass
print(n, flush=True)
"""


def test_root_removes_and_chowns_nothing_through_a_submit_as_users_link(attacker):
    """The validation's directory given again belongs to ``slurm.submit_as`` (here the user),
    who swaps its job directory ``n1`` for a link to a directory of root's and back, 300 times,
    while root writes the jobs (stale ``*.jsonl``/``*.exit`` removed) and hands the tree over
    (:func:`hpcstack.validate.outdir.chown_tree`): root's records stay, and stay root's.
    Positive control: the ``glob`` then ``unlink`` by name that ``write_jobs`` did removes
    root's record through such a link."""
    from types import SimpleNamespace

    from hpcstack.validate.outdir import chown_tree
    from hpcstack.validate.runner import write_jobs

    out = attacker.mkdir(attacker.home / "val")
    attacker.mkdir(out / "n1")
    roots = victim_dir(attacker)
    for name in ("roots.jsonl", "roots.exit"):
        (roots / name).write_text(VICTIM_TEXT)
    job = SimpleNamespace(directory=out / "n1", script_path=out / "n1" / "job.sh", script="#!/bin/sh\n")
    plan = SimpleNamespace(output_dir=out, jobs=[job])
    stop = attacker.shared / "stop"
    swapper = _as_user(attacker, "python3", "-c", _SWAP_JOB_DIR, str(out), str(roots), str(stop))
    written = 0
    try:
        assert swapper.stdout.readline() == "ready\n", swapper.stderr.read()
        for _ in range(300):
            try:
                write_jobs(plan)
                written += 1
            except OSError:
                pass
            try:
                chown_tree(out, attacker.name)
            except OSError:
                pass
            assert sorted(p.name for p in roots.iterdir()) == ["roots.exit", "roots.jsonl"]
    finally:
        stop.touch()
        out_, err = swapper.communicate(timeout=60)
    assert swapper.returncode == 0 and int(out_.split()[-1]) > 0, err
    assert written > 0, "no job was written: the test did not run against the swaps"
    for name in ("roots.jsonl", "roots.exit"):
        st = (roots / name).stat()
        assert (st.st_uid, (roots / name).read_text()) == (0, VICTIM_TEXT)
    assert roots.stat().st_uid == 0 and roots.stat().st_mode & 0o777 == 0o700
    # the positive control: glob, then unlink by name, through the user's link
    for left in (out / "n1", out / "n1.away"):
        if left.is_dir() and not left.is_symlink():
            shutil.rmtree(left)
        elif left.is_symlink() or left.exists():
            left.unlink()
    attacker.run("ln", "-s", str(roots), str(out / "n1"))
    for stale in [*(out / "n1").glob("*.jsonl"), *(out / "n1").glob("*.exit")]:
        stale.unlink()
    assert list(roots.iterdir()) == []


def test_show_of_a_users_stack_follows_no_link_at_its_record(attacker):
    """``hpcstack show ~rtuser/stack``: the user's ``.hpcstack`` is a link to a directory of
    root's holding another build's record; root's show printed that as the user's stack. Now it
    refuses in one line, exit 2, and prints nothing of root's (``--file`` too). Positive control:
    the record read by name through the link is root's."""
    roots = victim_dir(attacker)
    (roots / "provenance.json").write_text(json.dumps({"hpcstack": "roots-record", "site": {"name": "x"}}))
    (roots / "plan.json").write_text(json.dumps({"steps": [], "secret": "roots-plan"}))
    stack = attacker.mkdir(attacker.home / "stack")
    attacker.run("ln", "-s", str(roots), str(stack / ".hpcstack"))
    for extra in ((), ("--file", "plan.json"), ("--json",)):
        proc = hs("show", stack, *extra)
        refused(attacker, proc, f"{stack / '.hpcstack'}: a symbolic link")
        assert "roots-" not in proc.stdout + proc.stderr
    # the positive control: by name, through the link
    assert "roots-record" in (stack / ".hpcstack" / "provenance.json").read_text()


def test_show_of_a_users_stack_reads_no_hard_link_to_a_file_of_roots(attacker):
    """A file of root's hard-linked into the user's ``DIR/.hpcstack`` (where
    ``fs.protected_hardlinks`` is off, or a file the user may read): root's ``show`` neither
    prints it as the user's record nor lists its content (``--file`` too); the user's own
    files still show. Positive control: by name the link reads root's file."""
    roots = victim_dir(attacker)
    (roots / "secret.json").write_text(json.dumps({"steps": [], "secret": "roots-plan"}))
    stack = attacker.mkdir(attacker.home / "stack")
    state = attacker.mkdir(stack / ".hpcstack")
    attacker.write(state / "provenance.json", json.dumps({"hpcstack": "users-record", "site": {"name": "x"}}))
    os.link(roots / "secret.json", state / "plan.json")     # as the user would, with protected_hardlinks off
    assert "roots-plan" in (state / "plan.json").read_text()
    proc = hs("show", stack, "--file", "plan.json")
    assert "roots-plan" not in proc.stdout + proc.stderr, proc
    assert proc.returncode != 0 and "hard links" in proc.stderr, proc
    proc = hs("show", stack, "--json")
    assert "roots-plan" not in proc.stdout + proc.stderr, proc
