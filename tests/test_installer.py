"""The installer backend and the build cache: uv by default with hard links from a
per-site cache and bytecode compiled at install time, pip as the fallback, and a Horovod (here:
tiny) wheel reused when its build key is unchanged. Real uv, real pip, the tiny recipe."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO, TEST_PYTHON, hpcstack, make_sdist, unit_site, write_tiny_recipe
from hpcstack import data_root
from hpcstack.install.components.source import CachedWheelBuild
from hpcstack.install.plan import BUILD
from hpcstack.recipe import load_recipe
from hpcstack.install.resolve import resolve
from hpcstack.site import InstallerConfig, load_site, check_config

pytestmark = pytest.mark.unit

DEAD_INDEX = "http://127.0.0.1:9/simple"  # nothing listens there: using it fails at once


def write_site(path: Path, cache_dir: Path | None = None, installer: dict | None = None,
               build_env: dict | None = None, python: str | None = None) -> Path:
    """A copy of the localhost site with the given cache dir, installer section and build env;
    with ``python``, it states that Python version (a dry-run of it then loads no module)."""
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    if python:
        data["python"] = {"version": python}
    if cache_dir is not None:
        data["cache_dir"] = str(cache_dir)
    if installer is None:
        data.pop("installer", None)
    else:
        data["installer"] = installer
    if build_env:
        data.setdefault("build", {})["env"] = build_env
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def dry_run(*args: str) -> str:
    proc = hpcstack("install", *args, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def step(script: str, name: str) -> str:
    """The text of one step of a dry-run script."""
    return script.split(f"# --- step {name}:")[1].split("\n# --- ")[0]  # to the next step or wait


# ------------------------------------------------------------------------------- site section

def test_installer_defaults_are_uv_hardlinks_bytecode_and_build_cache(tmp_path):
    site = load_site(str(write_site(tmp_path / "s.yaml", installer=None)))
    assert site.installer == InstallerConfig()
    assert (site.installer.backend, site.installer.link_mode) == ("uv", "hardlink")
    assert site.installer.compile_bytecode and site.installer.build_cache


@pytest.mark.parametrize("installer, expected", [
    ({"backend": "conda"}, "installer.backend: 'conda' is not one of ['uv', 'pip']"),
    ({"link_mode": "symlink"}, "installer.link_mode: 'symlink' is not one of"),
    ({"compile_bytecode": "yes"}, "installer.compile_bytecode: 'yes' is not of type 'boolean'"),
    ({"wheelcache": "/x"}, "installer.wheelcache: unknown key"),
])
def test_bad_installer_section_is_one_line_with_its_key_path(installer, expected):
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["installer"] = installer
    problems = check_config(data, "s.yaml")
    assert len(problems) == 1 and expected in problems[0], problems


# ----------------------------------------------------------------------------- the dry-run

@pytest.mark.integration
def test_uv_installs_the_lock_with_hashes_hard_links_and_bytecode(tmp_path):
    script = dry_run("pytorch/2.3.1-gpu", "--site", "localhost", "--prefix", str(tmp_path / "sw"))
    wheels = step(script, "wheels").strip().splitlines()[-1]
    assert re.search(rf"uv pip install --python {tmp_path}/sw/pytorch/\S+/venv/bin/python ", wheels)
    for part in ("--no-config",
                 f"--cache-dir {tmp_path}/sw/.hpcstack/cache/uv", "--link-mode hardlink",
                 "--compile-bytecode", "--require-hashes", "-u UV_INDEX_URL", "-u UV_EXTRA_INDEX_URL",
                 "-u UV_CONFIG_FILE", "-u UV_NO_VERIFY_HASHES"):
        assert part in wheels, part
    assert wheels.endswith("-r " + str(data_root() / "recipes/pytorch/2.3.1-gpu.pypi.lock"))
    assert "--index-strategy" not in wheels  # one index: uv's default strategy
    install = step(script, "install")
    assert "--reinstall-package horovod" in install and "--compile-bytecode" in install
    assert "uv pip check --python" in step(script, "sanitycheck")
    # no ensurepip where uv installs; one interpreter imports and checks Horovod's flags
    assert "python3 -m venv --clear --without-pip /" in step(script, "venv")
    sanity = step(script, "sanitycheck")
    assert sanity.count("/venv/bin/python -c ") == 1 and "horovodrun --check-build" not in sanity
    assert "import torch\n" in sanity and 'REQUIRED = ["PyTorch", "MPI", "Gloo"]' in sanity
    assert "uv pip freeze --python" in sanity


def test_a_lock_with_two_indexes_lets_uv_look_in_both():
    """The cu121 lock names the PyTorch index and PyPI; torch==2.3.1+cu121 is only on the first."""
    wheels = step(dry_run("pytorch/2.3.1-gpu", "--site", "cirrus"), "wheels")
    assert "--index-strategy unsafe-best-match --require-hashes -r" in wheels


def test_pip_backend_is_the_fallback(tmp_path):
    site = write_site(tmp_path / "s.yaml", installer={"backend": "pip", "compile_bytecode": False},
                      python=TEST_PYTHON)
    script = dry_run("pytorch/2.3.1-gpu", "--site", str(site), "--prefix", str(tmp_path / "sw"))
    wheels = step(script, "wheels")
    assert "-m pip --isolated" in wheels and f"--cache-dir {tmp_path}/sw/.hpcstack/cache/pip" in wheels
    assert "--no-compile --require-hashes -r" in wheels and "uv " not in wheels
    assert "--force-reinstall" in step(script, "install")
    assert "python3 -m venv --clear /" in step(script, "venv")  # pip's venv keeps its pip
    assert " wheel --no-deps --no-build-isolation" in step(script, "build")
    assert "-m pip --isolated --no-input --disable-pip-version-check check" in step(script, "sanitycheck")


def test_build_step_reuses_a_cached_wheel_or_builds_and_stores_it(tmp_path):
    build = step(dry_run("pytorch/2.3.1-gpu", "--site", "cirrus"), "build")
    assert "hpcstack_build_key_horovod() {" in build
    assert ('if hpcstack action reuse-wheel horovod /work/y07/shared/cirrus-software/.hpcstack/cache/builds/'
            'horovod-0.28.1/"${hpcstack_build_key_horovod_key}" ') in build  # sha256 checked before reuse
    reuse, rebuild = build.split("\nelse\n")
    assert "--no-build-isolation" not in reuse
    assert "sha256sum -- *.whl > SHA256SUMS" in rebuild
    # a uv site's venv has no pip: uv builds the wheel with the venv's python
    assert " build --no-config --cache-dir " in rebuild and " --no-build-isolation --wheel --out-dir " in rebuild
    assert 'mv -T "$tmp"' in rebuild
    for probe in ("--- MPI", "--- CUDA", "--- NCCL", "--- python", "--- C++ compiler",
                  'export HOROVOD_CUDA_HOME="${NVHPC_ROOT}/cuda/12.4"',
                  "sdist horovod-0.28.1.tar.gz sha256 92a43f5a", "patch horovod-0.28.1-cxx17.patch sha256"):
        assert probe in build, probe
    site = write_site(tmp_path / "s.yaml", installer={"build_cache": False}, python=TEST_PYTHON)
    plain = step(dry_run("pytorch/2.3.1-gpu", "--site", str(site), "--prefix", str(tmp_path / "sw")), "build")
    assert "hpcstack_build_key" not in plain and " --no-build-isolation --wheel" in plain


# ------------------------------------------------------------------------------ the build key

@pytest.fixture(scope="module")
def horovod_build(tmp_path_factory):
    """The Horovod build action of the localhost plan (nothing runs), its roots in a temporary
    directory (the key reads the stack's python there: none, whatever the machine holds)."""
    root = tmp_path_factory.mktemp("horovod-build")
    path = root / "localhost.yaml"
    path.write_text(yaml.safe_dump(unit_site("localhost", roots=root)))
    site = load_site(str(path))
    plan = resolve(load_recipe("pytorch/2.3.1-gpu", site), site, python_version="3.11")
    action = next(a for s in plan.steps if s.name == BUILD for a in s.actions
                  if isinstance(a, CachedWheelBuild))
    return action


def _env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "CFLAGS", "MAKEFLAGS"))}
    env.update(changes)
    return env


def test_key_from_the_dry_run_script_equals_the_key_the_run_computes(horovod_build):
    """Both renderings of one action: the bash the dry-run prints, and what execute() computes."""
    script, anchor, _ = horovod_build.to_bash().partition("\nif hpcstack action reuse-wheel ")
    assert anchor, "the key computation must be followed by the reuse (nothing else may run here)"
    env = _env()
    proc = subprocess.run(["bash", "-c", script + '\necho "$hpcstack_build_key_horovod_key"'], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == CachedWheelBuild.key_of(horovod_build.key_text(env))
    assert len(proc.stdout.strip()) == 24


def test_key_covers_what_changes_the_binary_and_not_make_parallelism(horovod_build, tmp_path):
    key = lambda **env: CachedWheelBuild.key_of(horovod_build.key_text(_env(**env)))  # noqa: E731
    base = key()
    assert key() == base                                   # deterministic
    assert key(MAKEFLAGS="-j64") == base                   # parallelism: same binary
    assert key(CFLAGS="-O1") != base                       # compiler flags
    assert key(HOROVOD_GPU_OPERATIONS="NCCL") != base      # an operations flag from the environment
    other = tmp_path / "bin"                               # another MPI compiler wrapper on PATH
    other.mkdir()
    (other / "mpicc").write_text("#!/bin/sh\necho 'other mpicc 99.0'\n")
    (other / "mpicc").chmod(0o755)
    assert key(PATH=f"{other}:{os.environ['PATH']}") != base
    text = horovod_build.key_text(_env())
    for line in ("hpcstack build key v2", "package horovod 0.28.1", "--- MPI", "HOROVOD_WITH_MPI=1",
                 "HOROVOD_WITHOUT_CUDA=1"):
        assert line in text, line
    assert "MAKEFLAGS" not in text


def test_key_changes_with_the_patch(horovod_build):
    from dataclasses import replace

    other = replace(horovod_build, fixed=horovod_build.fixed[:-1] + ("patch x.patch sha256 00",))
    env = _env()
    assert CachedWheelBuild.key_of(other.key_text(env)) != CachedWheelBuild.key_of(horovod_build.key_text(env))


# ------------------------------------------------------------------ real installs, tiny recipe

@pytest.fixture(scope="module")
def tiny_uv(tmp_path_factory, localhost_ready):
    """The tiny recipe installed with uv into two prefixes sharing one site cache.

    The first install runs with hostile user settings (a dead index in UV_INDEX_URL, in a
    user uv.toml and in PIP_INDEX_URL): hpcstack must ignore them and use the lock's index.
    """
    root = tmp_path_factory.mktemp("installer")
    recipe = write_tiny_recipe(root / "recipes", make_sdist(root))
    cache = root / "cache"
    site = write_site(root / "site.yaml", cache_dir=cache, installer={})
    xdg = root / "xdg"
    (xdg / "uv").mkdir(parents=True)
    (xdg / "uv" / "uv.toml").write_text(f'index-url = "{DEAD_INDEX}"\n')
    hostile = {"UV_INDEX_URL": DEAD_INDEX, "UV_EXTRA_INDEX_URL": DEAD_INDEX, "XDG_CONFIG_HOME": str(xdg),
               "PIP_INDEX_URL": DEAD_INDEX}
    out = {"root": root, "recipe": recipe, "cache": cache, "site": site, "runs": {}}
    for name, env in (("a", hostile), ("b", {})):
        proc = hpcstack("install", str(recipe), "--site", str(site), "--prefix", str(root / name / "sw"),
                        "--module-root", str(root / name / "mf"), env=env)
        assert proc.returncode == 0, proc.stderr
        out["runs"][name] = proc
    return out


def _prefix(t: dict, name: str) -> Path:
    return t["root"] / name / "sw" / "tiny" / "1.0"


def _site_packages(t: dict, name: str) -> Path:
    return next((_prefix(t, name) / "venv" / "lib").glob("python3*/site-packages"))


def _build_log(prefix: Path) -> str:
    return "\n".join(p.read_text() for p in prefix.rglob("logs/build.log"))


@pytest.mark.integration
def test_uv_ignores_user_settings_and_hard_links_from_the_site_cache(tiny_uv):
    six = _site_packages(tiny_uv, "a") / "six.py"
    assert six.stat().st_nlink >= 2  # the cache's copy and the stack's (and the second stack's)
    cached = [p for p in (tiny_uv["cache"] / "uv").rglob("six.py") if p.stat().st_ino == six.stat().st_ino]
    assert cached, "six.py in the stack is not a hard link to the uv cache"
    assert (_site_packages(tiny_uv, "b") / "six.py").stat().st_ino == six.stat().st_ino


@pytest.mark.integration
def test_bytecode_is_compiled_at_install_so_imports_write_none(tiny_uv):
    sp = _site_packages(tiny_uv, "a")
    assert list((sp / "__pycache__").glob("six.cpython-*.pyc"))
    assert list((sp / "tinypkg" / "__pycache__").glob("__init__.cpython-*.pyc"))  # the source build too
    # unchecked-hash (PEP 552 flags 0b01), as uv compiles it with hpcstack's PYC_INVALIDATION_MODE
    assert {int.from_bytes(p.read_bytes()[4:8], "little") for p in sp.rglob("*.pyc")} == {1}

    def pycs():
        return {p: p.stat().st_mtime_ns for p in sp.rglob("*.pyc")}

    before = pycs()
    python = _prefix(tiny_uv, "a") / "venv" / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([str(python), "-c", "import six, tinypkg; assert tinypkg.PATCHED"], check=True, env=env)
    assert pycs() == before


@pytest.mark.integration
def test_first_install_builds_and_stores_the_wheel_the_second_reuses_it(tiny_uv):
    first, second = _build_log(_prefix(tiny_uv, "a")), _build_log(_prefix(tiny_uv, "b"))
    assert "no wheel with key" in first and "stored tinypkg-1.0-" in first
    assert "reusing the wheel built before" in second
    assert "pip" not in second.split("reusing the wheel built before")[1]  # nothing was built
    # with no wheel cached the patch step (in the background, while the wheels
    # install) unpacked and patched, and the build used that tree; with one it left them alone
    assert "unpacked and patched by the patch step" in first and "hpcstack action unpack" not in first
    patch_b = "\n".join(p.read_text() for p in _prefix(tiny_uv, "b").rglob("logs/patch.log"))
    assert "a wheel of this version is in" in patch_b and "hpcstack action unpack" not in patch_b
    entries = list((tiny_uv["cache"] / "builds" / "tinypkg-1.0").iterdir())
    assert len(entries) == 1 and len(entries[0].name) == 24
    assert (entries[0] / "key.txt").read_text().startswith("hpcstack build key v2\npackage tinypkg 1.0\n")
    assert list(entries[0].glob("tinypkg-1.0-*.whl"))
    python = _prefix(tiny_uv, "b") / "venv" / "bin" / "python"
    subprocess.run([str(python), "-c", "import tinypkg; assert tinypkg.PATCHED"], check=True)


@pytest.mark.integration
def test_a_uv_stack_has_no_pip_builds_with_uv_and_checks_in_one_interpreter(tiny_uv):
    """No ensurepip in a uv site's venv, the source build by `uv build`, the imports
    in one interpreter run, the package list for provenance from `uv pip freeze`."""
    prefix = _prefix(tiny_uv, "a")
    sp = _site_packages(tiny_uv, "a")
    assert not list(sp.glob("pip")) and not (prefix / "venv" / "bin" / "pip").exists()
    assert " build --no-config " in _build_log(prefix) and " wheel --no-deps" not in _build_log(prefix)
    sanity = "\n".join(p.read_text() for p in prefix.rglob("logs/sanitycheck.log"))
    assert sanity.count("/venv/bin/python -c ") == 1 and "imports ok: six, tinypkg" in sanity
    freeze = next(prefix.rglob(".hpcstack/pip-freeze.txt")).read_text().splitlines()
    assert "tinypkg==1.0" in freeze and "six==1.16.0" in freeze


@pytest.mark.integration
def test_a_changed_key_rebuilds(tiny_uv):
    site = write_site(tiny_uv["root"] / "site-cflags.yaml", cache_dir=tiny_uv["cache"], installer={},
                      build_env={"CFLAGS": "-O1"})
    root = tiny_uv["root"] / "c"
    proc = hpcstack("install", str(tiny_uv["recipe"]), "--site", str(site), "--prefix", str(root / "sw"),
                    "--module-root", str(root / "mf"))
    assert proc.returncode == 0, proc.stderr
    assert "no wheel with key" in _build_log(root / "sw" / "tiny" / "1.0")
    assert "hpcstack action unpack" in _build_log(root / "sw" / "tiny" / "1.0")  # not done ahead: a wheel was cached
    assert len(list((tiny_uv["cache"] / "builds" / "tinypkg-1.0").iterdir())) == 2


@pytest.mark.integration
def test_pip_backend_installs_compiles_and_ignores_pip_settings(localhost_ready, tmp_path):
    recipe = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    site = write_site(tmp_path / "site.yaml", installer={"backend": "pip"})
    proc = hpcstack("install", str(recipe), "--site", str(site), "--prefix", str(tmp_path / "sw"),
                    "--module-root", str(tmp_path / "mf"), env={"PIP_INDEX_URL": DEAD_INDEX})
    assert proc.returncode == 0, proc.stderr
    prefix = tmp_path / "sw" / "tiny" / "1.0"
    sp = next((prefix / "venv" / "lib").glob("python3*/site-packages"))
    assert list((sp / "__pycache__").glob("six.cpython-*.pyc"))
    assert list((sp / "tinypkg" / "__pycache__").glob("__init__.cpython-*.pyc"))
    assert (sp / "six.py").stat().st_nlink == 1  # pip copies
    wheels = "\n".join(p.read_text() for p in prefix.rglob("logs/wheels.log"))
    assert f"--cache-dir {tmp_path}/sw/.hpcstack/cache/pip --no-compile --require-hashes" in wheels
    # the bytecode compiled after the last package, unchecked-hash (PEP 552 flags 0b01)
    install = "\n".join(p.read_text() for p in prefix.rglob("logs/install.log"))
    assert "/install/bytecode.py -j " in install and " files compiled (unchecked-hash), level 0" in install
    assert {int.from_bytes(p.read_bytes()[4:8], "little") for p in sp.rglob("*.pyc")} == {1}
    sanity = "\n".join(p.read_text() for p in prefix.rglob("logs/sanitycheck.log"))
    assert "-m pip --isolated --no-input --disable-pip-version-check check" in sanity
