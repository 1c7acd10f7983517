"""What users meet, as a user meets it: an ordinary account, a login shell, the real module tool
(Environment Modules with the Tcl modulefile, Lmod with the Lua one), on a stack installed for
real from the tiny recipe (tests/conftest.py) with the localhost / localhost-lmod site.

- the module ``depends-on`` the exact base module the build loaded (a ``python/9.99`` put first
  on MODULEPATH is not taken), and fails with one line when its stack is missing or unreadable;
- ``pip`` on the module says in one line where packages go (exit 1), for a plain venv loaded
  under the module too, and ``module load`` in such a venv says how to fix it;
- a venv without pip is flagged by ``extend-venv-activate`` and ``hpcstack-doctor``, and the
  doctor without a venv reports the user site;
- ``module help`` and the whatis lines: packages and versions, what the variables change, how to
  launch, the examples installed with the stack; ``module search`` / ``module keyword`` find
  the stack by a package; the site's launcher variables and ``SLURM_EXPORT_ENV``.

About 1 minute per module tool (one tiny install each, then a few login shells).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import BASE_MODULES, hpcstack, make_sdist, write_tiny_recipe
from moduletools import require, tool_params

pytestmark = pytest.mark.integration

SITE_OF_TOOL = {"environment-modules": "localhost", "lmod": "localhost-lmod"}
PACKAGING_PIN = """\
packaging==24.1 \\
    --hash=sha256:026ed72c8ed3fcce5bf8950572258698927fd1dbda10a5e981cdf0ac37f4f002 \\
    --hash=sha256:5b8f2217dbdbd2f7f384c41c628544e6d52f2d0f53c6d0c3ea61aa5d1d7ff124
"""


@pytest.fixture(scope="module")
def user(ordinary_user) -> str:
    """An ordinary account (tests/conftest.py ``ordinary_user``); tests run login shells as it."""
    return ordinary_user


class Stack:
    """The tiny stack installed for one module tool, and how to run a user's login shell on it."""

    def __init__(self, tool, top: Path, user: str):
        self.tool, self.top, self.user = tool, top, user
        self.prefix = top / "sw" / "tiny" / "1.0"
        self.module_root = top / "mf"
        self.home = top / "home"

    def login(self, script: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """``runuser -u USER -- env -i … bash -lc``: a login shell as the user, with the module tool
        of this stack initialised and its module root and the base modules on MODULEPATH."""
        env = {"HOME": str(self.home), "USER": self.user, "LOGNAME": self.user, "SHELL": "/bin/bash",
               "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        head = (f"unset BASH_ENV; source {self.tool.init('bash')}\n"
                f"module use {BASE_MODULES}\nmodule use {self.module_root}\n")
        return subprocess.run(["runuser", "-u", self.user, "--", "env", "-i",
                               *(f"{k}={v}" for k, v in env.items()), "bash", "-lc", head + script],
                              capture_output=True, text=True, cwd="/", timeout=timeout)


@pytest.fixture(scope="module", params=tool_params())
def stack(request, user, localhost_ready):
    """The tiny recipe (with StackManifest, and examples/digits) installed for real for the
    site of the tool, in a world-readable directory; the user's home beside it."""
    tool = request.param
    require(tool)
    top = Path(tempfile.mkdtemp(prefix="hpcstack-user-side-", dir="/tmp"))
    top.chmod(0o755)
    try:
        recipe = write_tiny_recipe(top / "recipes", make_sdist(top))
        text = recipe.read_text().replace("StackTools,\n", "StackManifest, StackTools,\n")
        assert "        StackTools(),\n" in text
        text = text.replace("        StackTools(),\n", "        StackTools(examples=(\"digits\",)),\n")
        recipe.write_text(text.replace("        Imports((", "        StackManifest(),\n        Imports(("))
        # hpcstack-doctor reads versions with `packaging` (the PyTorch stack has it)
        lock = recipe.parent / "1.0.pypi.lock"
        lock.write_text(lock.read_text() + PACKAGING_PIN)
        proc = hpcstack("install", str(recipe), "--site", SITE_OF_TOOL[tool.name], "--prefix", str(top / "sw"),
                        "--module-root", str(top / "mf"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        s = Stack(tool, top, user)
        s.home.mkdir()
        pw = pwd.getpwnam(user)
        os.chown(s.home, pw.pw_uid, pw.pw_gid)
        yield s
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _base_module() -> str:
    """The base python module scripts/localhost-setup wrote (``python/X.Y``)."""
    [path] = [p for p in BASE_MODULES.glob("python/*") if not p.name.startswith(".")]
    return f"python/{path.name}"


def test_depends_on_names_the_base_module_the_build_loaded(stack):
    """A ``python/9.99`` first on MODULEPATH, which ``depends-on python`` would load: the module
    loads the base it was built on."""
    base = _base_module()
    modulefile = next(p for p in (stack.module_root / "tiny").iterdir() if p.name.startswith("1.0"))
    text = modulefile.read_text()
    assert (f'depends_on("{base}")' if stack.tool.syntax == "lua" else f"depends-on {base}") in text, text
    decoy = stack.top / "decoy"
    stack.tool.write_module(decoy, "python/9.99", setenv={"DECOY_PYTHON": "1"})
    proc = stack.login(f"module use {decoy}\nmodule load tiny/1.0 || exit 3\n"
                       "echo \"DECOY=${DECOY_PYTHON:-no} LOADED=$LOADEDMODULES\"")
    assert proc.returncode == 0, proc.stderr
    assert "DECOY=no" in proc.stdout and base in proc.stdout, proc.stdout + proc.stderr


def test_a_missing_or_unreadable_stack_fails_the_load_with_one_line(stack):
    build = Path(os.path.realpath(stack.prefix))
    mode = build.stat().st_mode
    build.chmod(0o700)                      # root's only: the user cannot read the stack
    try:
        proc = stack.login("module load tiny/1.0; echo \"rc=$?\"; command -v python3")
    finally:
        build.chmod(mode)
    assert "rc=0" not in proc.stdout, proc.stdout + proc.stderr
    assert f"tiny/1.0: its stack {stack.prefix} is missing or unreadable" in " ".join(proc.stderr.split()), proc.stderr
    assert "Traceback" not in proc.stderr and "while executing" not in proc.stderr, proc.stderr
    # a modulefile whose stack is gone
    gone = stack.top / "gone"
    src = next(p for p in (stack.module_root / "tiny").iterdir() if p.name.startswith("1.0"))
    (gone / "tiny").mkdir(parents=True)
    moved = src.read_text().replace(str(stack.prefix), "/nonexistent/tiny/1.0")
    (gone / "tiny" / src.name.replace("1.0", "2.0")).write_text(moved)
    proc = stack.login(f"module use {gone}\nmodule load tiny/2.0; echo \"rc=$?\"")
    assert "rc=0" not in proc.stdout and "its stack /nonexistent/tiny/1.0 is missing or unreadable" in \
        " ".join(proc.stderr.split()), proc.stdout + proc.stderr


def test_pip_on_the_module_says_where_packages_go(stack):
    proc = stack.login("module load tiny/1.0 || exit 3\ncommand -v pip\n"
                       "pip install --user six; echo \"rc=$?\"; pip3 list; echo \"rc3=$?\"")
    assert proc.stdout.splitlines()[0] == f"{stack.prefix}/bin/pip", proc.stdout
    assert "rc=1" in proc.stdout and "rc3=1" in proc.stdout, proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.startswith("pip: ")]
    assert lines and lines[0].startswith("pip: tiny/1.0 takes no packages"), proc.stderr
    assert "extend-venv-activate ~/myvenv" in lines[0]
    assert not (stack.home / ".local").exists()


def test_a_plain_venv_under_the_module_is_named_with_its_fix(stack):
    """Activate a venv that is not extended, then load the module: one line on load; `pip` then
    refuses with the fix instead of installing what python would not import."""
    venv = stack.home / "plain"
    proc = stack.login(f"python3 -m venv {venv} && source {venv}/bin/activate || exit 3\n"
                       "module load tiny/1.0 || exit 4\necho LOADED\n"
                       "pip install six; echo \"rc=$?\"")
    assert "LOADED" in proc.stdout and "rc=1" in proc.stdout, proc.stdout + proc.stderr
    said = " ".join(proc.stderr.split())
    assert f"tiny/1.0: the active venv {venv} is not extended for this module" in said, proc.stderr
    assert f"extend-venv-activate {venv}; source {venv}/bin/activate" in said
    assert f"pip: the active venv {venv} is not extended for tiny/1.0" in said
    assert not list((venv / "lib").glob("python*/site-packages/six*"))
    # the fix the module prints, typed as printed: then python and pip are the venv's, quietly
    fix = re.search(r"fix: (.*?/bin/activate)", said).group(1).split("; ")
    assert fix[:3] == ["module unload tiny/1.0", "deactivate", "module load tiny/1.0"], fix
    proc = stack.login(f"source {venv}/bin/activate && module load tiny/1.0 2>/dev/null || exit 3\n"
                       + "\n".join(fix) + "\n"
                       "command -v pip; python -c 'import sys, tinypkg; print(sys.prefix)'")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-2:] == [f"{venv}/bin/pip", str(venv)], proc.stdout + proc.stderr
    assert "not extended" not in " ".join(proc.stderr.split()), proc.stderr      # Lmod wraps lines
    # in the extended venv, a load by hand reads its activate (Lua: luaposix, O_NONBLOCK) and finds
    # the fence: no line
    proc = stack.login(f"source {venv}/bin/activate || exit 3\nmodule purge\n"
                       "module load tiny/1.0 || exit 4\necho \"VENV=$VIRTUAL_ENV\"")
    assert proc.returncode == 0 and f"VENV={venv}" in proc.stdout, proc.stdout + proc.stderr
    assert "not extended" not in " ".join(proc.stderr.split()), proc.stderr


def test_a_venv_without_pip_is_flagged_and_the_doctor_reads_the_user_site(stack):
    venv = stack.home / "nopip"     # as `uv venv` without --seed makes it
    proc = stack.login(f"module load tiny/1.0 || exit 3\npython3 -m venv --without-pip {venv} || exit 4\n"
                       f"extend-venv-activate {venv}; echo \"extend=$?\"\n"
                       f"source {venv}/bin/activate || exit 5\nhpcstack-doctor; echo \"doctor=$?\"\n"
                       "pip install six; echo \"pip=$?\"")
    said = " ".join(proc.stderr.split())
    assert "extend=0" in proc.stdout and f"extend-venv-activate: warning: {venv} has no pip of its own" in said, said
    assert "doctor=1" in proc.stdout and f"no pip: {venv} has no pip of its own" in proc.stdout, proc.stdout
    assert "pip=1" in proc.stdout and f"pip: the active venv {venv} has no pip" in said, said
    # no venv: the doctor looks at the user site of the stack's python
    proc = stack.login("module load tiny/1.0 || exit 3\n"
                       "python3 -c 'import site; print(site.getusersitepackages())'")
    user_site = Path(proc.stdout.strip())
    (user_site / "usersiteonly-1.0.dist-info").mkdir(parents=True)
    (user_site / "usersiteonly-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: usersiteonly\nVersion: 1.0\n")
    try:
        proc = stack.login("module load tiny/1.0 || exit 3\nhpcstack-doctor; echo \"doctor=$?\"")
    finally:
        shutil.rmtree(stack.home / ".local")
    assert "doctor=1" in proc.stdout and f"user site: usersiteonly 1.0 in {user_site}" in proc.stdout, \
        proc.stdout + proc.stderr


def test_the_module_explains_itself_and_can_be_found_by_a_package(stack):
    proc = stack.login("module help tiny/1.0 2>&1; echo ===; module whatis tiny/1.0 2>&1")
    help_text, whatis = proc.stdout.split("===")
    for needle in ("What is in it (every package and its version:", "six 1.16.0", "tinypkg 1.0",
                   "no GPUs", "PYTHONNOUSERSITE=1", "PIP_CONSTRAINT", "SLURM_MPI_TYPE=pmix",
                   "How to launch on", "srun python train.py", "OMP_NUM_THREADS",
                   f"Examples: {stack.prefix}/examples (digits)"):
        assert needle in help_text, (needle, help_text)
    assert "Packages: six 1.16.0, packaging 24.1, tinypkg 1.0" in whatis, whatis
    assert "Keywords: tiny, six, packaging, tinypkg" in whatis and "Hardware: CPUs only" in whatis, whatis
    assert (stack.prefix / "examples" / "digits" / "train_digits.py").is_file()
    search = "module keyword tinypkg" if stack.tool.name == "lmod" else "module search tinypkg"
    proc = stack.login(f"{search} 2>&1")
    assert "tiny/1.0" in proc.stdout, proc.stdout


def test_the_site_launcher_variables_and_export_none(stack):
    proc = stack.login("export SLURM_EXPORT_ENV=NONE\nmodule load tiny/1.0 || exit 3\n"
                       "echo \"MPI=$SLURM_MPI_TYPE EXPORT=$SLURM_EXPORT_ENV\"\n"
                       "module unload tiny/1.0; echo \"AFTER=${SLURM_MPI_TYPE:-unset}\"")
    assert "MPI=pmix EXPORT=ALL" in proc.stdout and "AFTER=unset" in proc.stdout, proc.stdout + proc.stderr


def test_a_job_of_sbatch_export_none_starts_its_tasks_with_the_module(stack):
    """``sbatch --export=NONE`` on the local 2-node cluster, as an ordinary user: the script loads
    the module, and a plain ``srun python`` (no --mpi, no --export) starts one task per node in
    the module's environment, with one thread per core of the task. About 10 s."""
    from conftest import two_node_cluster, user_writable_dir

    with two_node_cluster():
        job_user = os.environ.get("HPCSTACK_SLURM_USER", "hpcstack-test")
        workdir_gen = user_writable_dir(job_user, "hpcstack-user-side-job-")
        workdir = next(workdir_gen)
        try:
            script = workdir / "job.sh"
            script.write_text(f"""#!/bin/bash
#SBATCH --partition=debug --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --time=00:02:00
unset BASH_ENV
source {stack.tool.init('bash')}
module use {BASE_MODULES}
module use {stack.module_root}
echo "BEFORE=${{SLURM_EXPORT_ENV:-unset}}"
module load tiny/1.0 || exit 3
export OMP_NUM_THREADS=${{SLURM_CPUS_PER_TASK:-1}}
echo "AFTER=$SLURM_EXPORT_ENV MPI=$SLURM_MPI_TYPE"
srun python -c 'import os, tinypkg; print("TASK", os.environ["SLURM_PROCID"], \\
    os.environ["OMP_NUM_THREADS"], tinypkg.PATCHED)'
""")
            script.chmod(0o755)
            proc = subprocess.run(["runuser", "-u", job_user, "--", "sbatch", "--wait", "--export=NONE",
                                   f"--chdir={workdir}", f"--output={workdir}/job.out", str(script)],
                                  capture_output=True, text=True, timeout=240, cwd=str(workdir))
            out = (workdir / "job.out").read_text() if (workdir / "job.out").exists() else ""
            assert proc.returncode == 0, proc.stdout + proc.stderr + out
            assert "BEFORE=NONE" in out and "AFTER=ALL MPI=pmix" in out, out
            assert sorted(line for line in out.splitlines() if line.startswith("TASK")) == \
                ["TASK 0 1 True", "TASK 1 1 True"], out
        finally:
            next(workdir_gen, None)
