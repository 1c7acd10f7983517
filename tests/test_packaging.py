"""hpcstack as a Python distribution: what its sdist and wheel ship, and the wheel
installed by an unprivileged user into their own home with a venv and pip, ``uv tool install`` and
``pipx install``, each giving a working ``hpcstack``; then the flow of an admin without root
(docs/admin/own-repos.md, "An admin without root"): their own site repository, a recipe installed into a prefix
they own, its module loaded, and the Cirrus dry-run.

The wheel and sdist are the ones ``scripts/localhost-setup`` builds into /opt/hpcstack/dist
(``HPCSTACK_DIST``); the user is ``hpcstack-admin`` (``HPCSTACK_ADMIN_USER``), created as root
with a home under /home. Its home is emptied at the start of a run except for ``~/.cache``, so
that the pip and uv caches of the earlier run save the downloads.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import pwd
import shutil
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import hpcstack as package
from conftest import MODULES_INIT, REPO, make_sdist, write_tiny_recipe

pytestmark = pytest.mark.integration

DIST = Path(os.environ.get("HPCSTACK_DIST", "/opt/hpcstack/dist"))
VERSION = package.__version__
DATA_DIRS = ("recipes", "site-configs", "modulefiles", "templates", "scripts", "trainer", "examples", "requirements")
#: Files the tool cannot work without, whatever else the data directories hold.
ESSENTIAL = (
    "recipes/pytorch/2.3.1-gpu.py", "recipes/pytorch/2.3.1-gpu.in",
    "recipes/pytorch/2.3.1-gpu.pypi.lock", "recipes/pytorch/2.3.1-gpu.cu121.lock",
    "recipes/pytorch/patches/horovod-0.28.1-cxx17.patch",
    "site-configs/localhost.yaml", "site-configs/cirrus.yaml", "site-configs/localhost-lmod.yaml",
    "modulefiles/modulefile.tcl.j2", "modulefiles/modulefile.lua.j2",
    "modulefiles/version.tcl.j2", "modulefiles/modulerc.lua.j2",
    "templates/extend-venv-activate.j2", "trainer/hpcstack-train-benchmark", "trainer/hpcstack_train/cli.py",
    "templates/slurm-job.sh.j2",
    "scripts/localhost-setup", "scripts/localhost-slurm",
)
UV = Path("/opt/hpcstack/tool/bin/uv")       # installed by scripts/localhost-setup
PIPX = Path("/opt/hpcstack/tool/bin/pipx")   # the test extras (scripts/localhost-setup --with-test-tools)
ADMIN = os.environ.get("HPCSTACK_ADMIN_USER", "hpcstack-admin")
#: How this machine reaches PyPI (CA bundle, proxies): passed on to the user's otherwise clean
#: environment. Nothing else of root's environment is.
NETWORK_VARS = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE",
                "UV_NATIVE_TLS", "PIP_DEFAULT_TIMEOUT", "UV_HTTP_TIMEOUT", "http_proxy", "https_proxy",
                "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "all_proxy", "ALL_PROXY")


def _dist_file(name: str) -> Path:
    path = DIST / name
    if not path.is_file():
        pytest.skip(f"{path} missing: scripts/localhost-setup builds it (uv build)")
    return path


@pytest.fixture(scope="module")
def wheel() -> Path:
    return _dist_file(f"hpcstack-{VERSION}-py3-none-any.whl")


@pytest.fixture(scope="module")
def sdist() -> Path:
    return _dist_file(f"hpcstack-{VERSION}.tar.gz")


def _checkout_data() -> dict[str, int]:
    """The files of the checkout's data directories (what ``hpcstack/data/*`` links to): path -> mode."""
    files = {}
    for d in DATA_DIRS:
        for p in sorted((REPO / d).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
                files[str(p.relative_to(REPO))] = p.stat().st_mode
    return files


def _wheel_data(path: Path) -> dict[str, int]:
    """``hpcstack/data/*`` in a wheel: path relative to ``data/`` -> the mode it installs with."""
    with zipfile.ZipFile(path) as z:
        return {i.filename.removeprefix("hpcstack/data/"): i.external_attr >> 16
                for i in z.infolist() if i.filename.startswith("hpcstack/data/") and not i.is_dir()}


# --- (a) what the wheel and the sdist ship --------------------------------------------------


def test_the_wheel_ships_the_data_as_package_data(wheel):
    data = _wheel_data(wheel)
    missing = [f for f in ESSENTIAL if f not in data]
    assert not missing, f"{wheel.name} lacks {missing}"
    assert not [f for f in data if "__pycache__" in f or f.endswith(".pyc")]
    with zipfile.ZipFile(wheel) as z:
        assert not [n for n in z.namelist() if "__pycache__" in n or n.endswith(".pyc")]
        entry_points = z.read(f"hpcstack-{VERSION}.dist-info/entry_points.txt").decode()
    assert "hpcstack = hpcstack.cli:main" in entry_points
    # every file of the checkout's recipes/, site-configs/, modulefiles/, templates/ and scripts/, no more
    checkout = _checkout_data()
    assert sorted(data) == sorted(checkout), "the wheel is stale or incomplete: re-run scripts/localhost-setup"
    # the scripts keep their executable bit (localhost-setup, localhost-slurm, …)
    for name, mode in checkout.items():
        assert bool(data[name] & 0o111) == bool(mode & 0o111), name
    assert data["scripts/localhost-setup"] & 0o755 == 0o755


def test_the_sdist_ships_the_data_as_files(sdist):
    top = f"hpcstack-{VERSION}/"
    with tarfile.open(sdist) as tar:
        members = {m.name.removeprefix(top): m for m in tar.getmembers()}
    for name in ("setup.cfg", "pyproject.toml", "README.md", "hpcstack/__init__.py", "hpcstack/repos.py"):
        assert name in members, name
    data = {n.removeprefix("hpcstack/data/"): m for n, m in members.items()
            if n.startswith("hpcstack/data/") and not m.isdir()}
    # regular files, not the checkout's links (a wheel built from the sdist would have none)
    assert not [n for n, m in data.items() if not m.isfile()]
    assert not [n for n in members if "__pycache__" in n or n.endswith(".pyc")]
    assert not [f for f in ESSENTIAL if f not in data]
    assert sorted(data) == sorted(_checkout_data())


def test_a_wheel_built_from_the_checkout_ships_the_same_data(wheel, tmp_path):
    """What ``pip install .``, ``uv tool install .`` and ``pipx install .`` do: build a wheel from
    the source tree itself (where ``hpcstack/data/*`` are links), not from the sdist."""
    if not UV.is_file():
        pytest.skip(f"{UV} missing; run scripts/localhost-setup")
    src = tmp_path / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".venv", ".pytest_cache", ".hypothesis"))
    assert (src / "hpcstack" / "data" / "recipes").is_symlink()
    proc = subprocess.run([str(UV), "build", "--wheel", "--no-config", "--quiet", "--out-dir",
                           str(tmp_path / "out"), str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    [built] = (tmp_path / "out").glob("hpcstack-*.whl")
    assert _wheel_data(built) == _wheel_data(wheel)


# --- (b) installed by an unprivileged user into their home -----------------------------------


@dataclass
class User:
    """An unprivileged user; :meth:`run` runs a bash login shell as them with a clean environment."""

    name: str
    home: Path
    uid: int
    gid: int

    def run(self, script: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """``runuser -u USER -- env -i … bash -lc SCRIPT`` in their home: only HOME, USER, a
        system PATH (the login shell's profile adds ``~/.local/bin`` when it exists) and how to
        reach PyPI (:data:`NETWORK_VARS`); nothing of root's."""
        env = {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name, "SHELL": "/bin/bash",
               "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        env.update({k: os.environ[k] for k in NETWORK_VARS if k in os.environ})
        cmd = ["runuser", "-u", self.name, "--", "env", "-i",
               *(f"{k}={v}" for k, v in env.items()), "bash", "-lc", "set -eo pipefail\n" + script]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=self.home, timeout=timeout)

    def ok(self, script: str, timeout: float = 600) -> str:
        proc = self.run(script, timeout)
        assert proc.returncode == 0, f"as {self.name}: {script}\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    def files_outside_home(self) -> set[str]:
        """Everything on this machine owned by the user, but their home."""
        roots, devices = [], set()
        for root in ("/", "/tmp", "/var/tmp", "/dev/shm", "/run"):  # each file system once
            if os.path.isdir(root) and os.stat(root).st_dev not in devices:
                devices.add(os.stat(root).st_dev)
                roots.append(root)
        proc = subprocess.run(["find", *roots, "-xdev",
                               "(", "-path", "/proc", "-o", "-path", "/sys", "-o", "-path", str(self.home),
                               ")", "-prune", "-o", "-user", self.name, "-print"],
                              capture_output=True, text=True, timeout=600)
        return set(proc.stdout.splitlines())


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


@pytest.fixture(scope="module")
def admin() -> User:
    """``hpcstack-admin``: no root, no sudo, a home under /home emptied but for ``~/.cache``, and
    nothing of theirs in the temporary directories."""
    if os.geteuid() != 0:
        pytest.skip("creating the unprivileged admin user needs root")
    if not shutil.which("runuser"):
        pytest.skip("runuser missing (util-linux)")
    try:
        pw = pwd.getpwnam(ADMIN)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--comment",
                        "hpcstack admin without root (tests)", ADMIN], check=True)
        pw = pwd.getpwnam(ADMIN)
    home = Path(pw.pw_dir)
    assert pw.pw_uid != 0 and home.is_relative_to("/home"), pw
    for p in list(home.iterdir()):
        if p.name != ".cache":
            _remove(p)
    subprocess.run(["cp", "-rT", "/etc/skel", str(home)], check=True)
    subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(home)], check=True)
    home.chmod(0o755)
    # what a run that was cut short may have left in the temporary directories
    for tmp in ("/tmp", "/var/tmp", "/dev/shm"):
        for p in Path(tmp).iterdir() if os.path.isdir(tmp) else ():
            try:
                if p.lstat().st_uid == pw.pw_uid:
                    _remove(p)
            except FileNotFoundError:  # other tests' files come and go meanwhile
                pass
    return User(ADMIN, home, pw.pw_uid, pw.pw_gid)


def _check_tool(user: User, command: str) -> None:
    """``command`` (a user's hpcstack) runs from the user's own install and has its data."""
    assert user.ok(f"{command} --version").strip() == f"hpcstack {VERSION}"
    listing = json.loads(user.ok(f"{command} list --json"))
    [builtin] = listing["search_path"]
    assert builtin["origin"] == "built-in"
    assert Path(builtin["path"]).is_relative_to(user.home), builtin  # the user's install, not /opt's
    text = user.ok(f"{command} list")
    assert re.search(r"^  pytorch/2\.3\.1-gpu +built-in$", text, re.M) and "  cirrus" in text, text
    assert "pytorch/2.3.1-gpu" in [e["name"] for e in listing["recipes"]]
    assert "cirrus" in [e["name"] for e in listing["site-configs"]]
    plan = user.ok(f"{command} install pytorch/2.3.1-gpu --site cirrus --dry-run")
    assert "module load python/3.12.1-gpu" in plan


def _local_bin_is_free(user: User) -> None:
    link = user.home / ".local" / "bin" / "hpcstack"
    assert not os.path.lexists(link), f"{link} left over: a test before did not uninstall"


def test_venv_and_pip(admin, wheel):
    admin.ok(f"python3 -m venv ~/hpcstack-venv && ~/hpcstack-venv/bin/pip install -q {wheel}")
    found = admin.ok("source ~/hpcstack-venv/bin/activate && command -v hpcstack").strip()
    assert found == f"{admin.home}/hpcstack-venv/bin/hpcstack"
    _check_tool(admin, "source ~/hpcstack-venv/bin/activate && hpcstack")
    _check_tool(admin, "~/hpcstack-venv/bin/hpcstack")  # without activating


@pytest.mark.parametrize("installer", ["uv", "pipx"])
def test_tool_install(admin, wheel, installer):
    """``uv tool install`` and ``pipx install`` of the wheel: a venv of its own under
    ``~/.local/share``, the command linked into ``~/.local/bin``; the uninstall removes it."""
    tool, venvs, hint = {
        "uv": (UV, ".local/share/uv/tools/hpcstack", "run scripts/localhost-setup"),
        "pipx": (PIPX, ".local/share/pipx/venvs/hpcstack",
                 "scripts/localhost-setup --with-test-tools installs it (test extras)"),
    }[installer]
    if not tool.is_file():
        pytest.skip(f"{tool} missing; {hint}")
    _local_bin_is_free(admin)
    install = f"{tool} tool install" if installer == "uv" else f"{tool} install"
    uninstall = f"{tool} tool uninstall" if installer == "uv" else f"{tool} uninstall"
    try:
        admin.ok(f"{install} {wheel}")
        # a new login shell has ~/.local/bin on its PATH (Debian's ~/.profile)
        assert admin.ok("command -v hpcstack").strip() == f"{admin.home}/.local/bin/hpcstack"
        target = os.readlink(admin.home / ".local/bin/hpcstack")
        assert Path(target).is_relative_to(admin.home / venvs), target
        _check_tool(admin, "hpcstack")
    finally:
        admin.run(f"{uninstall} hpcstack")
    assert not os.path.lexists(admin.home / ".local/bin/hpcstack")


# --- (c) an admin without root ---------------------------------------------------------------

#: The site config of the admin's own stacks: the built-in localhost one, with the install root
#: and module root in their home and no Slurm user to submit as (that is for root).
MYSITE = r"""sed -e 's/^name: localhost$/name: mysite/' \
    -e "s|^install_root: .*|install_root: $HOME/software|" \
    -e "s|^module_root: .*|module_root: $HOME/modulefiles|" \
    -e '/submit_as:/d' "$builtin/site-configs/localhost.yaml" > ~/site-repo/site-configs/mysite.yaml
"""


@pytest.fixture(scope="module")
def admin_flow(admin, wheel, localhost_ready):
    """The "An admin without root" of docs/admin/own-repos.md, step by step, as ``hpcstack-admin``: each step's
    result, for the tests below to judge."""
    if not UV.is_file():
        pytest.skip(f"{UV} missing; run scripts/localhost-setup")
    opt_before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in DIST.iterdir() if p.is_file()}
    _local_bin_is_free(admin)
    steps = {}
    # 1. hpcstack into their own account
    steps["tool"] = admin.run(f"{UV} tool install {wheel}")
    assert steps["tool"].returncode == 0, steps["tool"].stderr
    # 2. the site repository: their own site config, a copy of the built-in cirrus one, a recipe
    steps["repo"] = admin.run(
        "mkdir -p ~/site-repo/site-configs ~/site-repo/recipes\n"
        "builtin=$(hpcstack list --json | python3 -c 'import json, sys; "
        "print(json.load(sys.stdin)[\"search_path\"][-1][\"path\"])')\n"
        'cp "$builtin/site-configs/cirrus.yaml" ~/site-repo/site-configs/\n' + MYSITE)
    assert steps["repo"].returncode == 0, steps["repo"].stderr
    # the recipe the site keeps in its repository: tests' tiny one (tiny/1.0 with lock and patch)
    sources = admin.home / "sources"
    sources.mkdir()
    recipe = write_tiny_recipe(admin.home / "site-repo" / "recipes", make_sdist(sources))
    subprocess.run(["chown", "-R", f"{admin.uid}:{admin.gid}", str(sources), str(admin.home / "site-repo")],
                   check=True)
    steps["recipe"] = recipe
    steps["list"] = admin.run("hpcstack list --repo ~/site-repo")
    # 3. install into the prefix they own
    steps["install"] = admin.run("hpcstack install tiny/1.0 --site mysite --repo ~/site-repo")
    # 4. its module, in a bash with Environment Modules
    steps["module"] = admin.run(
        f"source {MODULES_INIT}\nmodule use ~/modulefiles\nmodule load tiny/1.0\n"
        "python -c 'import six, tinypkg; assert tinypkg.PATCHED; print(tinypkg.__file__)'\n"
        "command -v extend-venv-activate")
    # 5. the Cirrus plan from the site's copy of the cirrus config
    steps["cirrus"] = admin.run("hpcstack install pytorch/2.3.1-gpu --site ~/site-repo/site-configs/cirrus.yaml "
                                "--dry-run")
    steps["cirrus-relative"] = admin.run("cd ~/site-repo && hpcstack install pytorch/2.3.1-gpu "
                                         "--site ./site-configs/cirrus.yaml --dry-run")
    steps["outside"] = admin.files_outside_home()
    steps["opt"] = (opt_before, {p: hashlib.sha256(p.read_bytes()).hexdigest()
                                 for p in DIST.iterdir() if p.is_file()})
    yield steps
    admin.run(f"{UV} tool uninstall hpcstack")


def test_admin_lists_their_repository(admin, admin_flow):
    proc = admin_flow["list"]
    assert proc.returncode == 0, proc.stderr
    repo = admin.home / "site-repo"
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith("  ")}
    assert lines["tiny/1.0"].split(None, 1)[1] == f"--repo {repo}"
    assert lines["mysite"].split(None, 1)[1] == f"--repo {repo}"
    assert f"--repo {repo}; shadows built-in" in lines["cirrus"]


def test_admin_installs_into_a_prefix_they_own(admin, admin_flow):
    proc = admin_flow["install"]
    assert proc.returncode == 0, proc.stderr
    prefix = admin.home / "software" / "tiny" / "1.0"
    modulefile = admin.home / "modulefiles" / "tiny" / "1.0"
    assert f"installed tiny/1.0: {prefix} -> {admin.home}/software/tiny/.1.0-" in proc.stdout
    assert prefix.is_symlink() and Path(os.path.realpath(prefix)).is_relative_to(admin.home / "software")
    assert str(prefix) in modulefile.read_text()
    # the recipe recorded is the one of their repository
    recorded = Path(os.path.realpath(prefix)) / ".hpcstack" / "recipe" / "1.0.py"
    assert recorded.read_text() == admin_flow["recipe"].read_text()
    not_theirs = [str(p) for root in (admin.home / "software", admin.home / "modulefiles")
                  for p in (root, *root.rglob("*")) if p.lstat().st_uid != admin.uid]
    assert not not_theirs


def test_admin_loads_the_module(admin, admin_flow):
    proc = admin_flow["module"]
    assert proc.returncode == 0, proc.stderr
    tinypkg, tool = proc.stdout.split()
    assert Path(tinypkg).is_relative_to(admin.home / "software" / "tiny")
    assert tool == f"{admin.home}/software/tiny/1.0/bin/extend-venv-activate"


def test_admin_dry_runs_cirrus_from_the_repository(admin_flow):
    for step in ("cirrus", "cirrus-relative"):
        proc = admin_flow[step]
        assert proc.returncode == 0, proc.stderr
        assert "module load python/3.12.1-gpu" in proc.stdout
        assert "# prefix: /work/y07/shared/cirrus-software/pytorch/2.3.1-gpu" in proc.stdout


def test_admin_writes_nothing_outside_their_home(admin, admin_flow):
    assert admin_flow["outside"] == set()
    before, after = admin_flow["opt"]
    assert before == after
    for path in ("/opt/hpcstack/software/tiny", "/opt/hpcstack/modulefiles/tiny"):
        assert not os.path.lexists(path), path
