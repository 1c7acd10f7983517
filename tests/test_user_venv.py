"""Users' own venvs on top of the stack: the constraints file, PYTHONNOUSERSITE, the
CycloneDX SBOM and ``hpcstack doctor``.

The integration tests use real pip and uv in real venvs extended with ``extend-venv-activate``,
under Environment Modules and under Lmod, on the installed stack (read only; see
:func:`moduletools.find_installed_stack`). That stack's own modulefile may predate its constraints file, so
each test renders the modulefile an install writes now into a module root of its own, with the
constraints file an install writes now in a temporary directory. pip reaches PyPI (``rich``).
The whole file: about 2 minutes on 2 cores (the pip and uv tests about 30 s per module tool,
the tiny install with pip about 40 s, the re-lock 15 s).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import hpcstack
from hpcstack.fsutil import sha256_file
from hpcstack.install.components.manifest import (CONSTRAINTS, WriteSbom, probed_versions, read_lock)
from hpcstack.install.components.modulefile import render_for_prefix
from hpcstack.install.actions import WriteFile
from hpcstack.install.resolve import resolve
from hpcstack.recipe import load_recipe
from hpcstack.site import load_site
from moduletools import BASE_PATH, find_installed_stack, require, tool_params

pytestmark = pytest.mark.unit

LOCK = Path(__file__).resolve().parents[1] / "recipes" / "pytorch" / "2.3.1-gpu.pypi.lock"


@pytest.fixture(scope="module")
def plan():
    site = load_site("localhost")
    return resolve(load_recipe("pytorch/2.3.1-gpu", site), site, python_version="3.11")


def _actions(plan):
    return [a for s in plan.steps for a in s.actions]


def constraints_of(plan) -> str:
    return next(a for a in _actions(plan) if isinstance(a, WriteFile) and a.path.endswith("/" + CONSTRAINTS)).content


# ------------------------------------------------------------------------------ constraints

def test_constraints_hold_every_pin_of_the_lock_and_horovod(plan):
    from packaging.requirements import Requirement

    text = constraints_of(plan)
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    reqs = [Requirement(line) for line in lines]  # every line is a valid PEP 508 requirement
    pins = read_lock(str(LOCK))
    assert len(pins) > 60
    assert {(p.name, p.version) for p in pins} <= {(r.name, str(r.specifier)[2:]) for r in reqs}
    assert "horovod==0.28.1" in lines
    assert "torch==2.3.1" in lines
    assert any(line.startswith("triton==2.3.1 ; python_full_version < '3.12'") for line in lines)
    assert "--hash" not in text  # a hashed constraint would put pip in hash-checking mode


@pytest.mark.parametrize("syntax", ["tcl", "lua"])
def test_the_modulefile_sets_nousersite_and_the_constraints(syntax):
    site = load_site("localhost")
    text = render_for_prefix(site, load_recipe("pytorch/2.3.1-gpu", site), "/p/pytorch/2.3.1-gpu", "3.11", syntax)
    path = "/p/pytorch/2.3.1-gpu/.hpcstack/constraints.txt"
    if syntax == "tcl":
        want = ["setenv PYTHONNOUSERSITE {1}", f"setenv PIP_CONSTRAINT {{{path}}}", f"setenv UV_CONSTRAINT {{{path}}}"]
    else:
        want = ['setenv("PYTHONNOUSERSITE", "1")', f'setenv("PIP_CONSTRAINT", "{path}")',
                f'setenv("UV_CONSTRAINT", "{path}")']
    for line in want:
        assert line in text, text


# ------------------------------------------------------------------------------ the SBOM

class _Ctx:
    def __init__(self):
        self.env = dict(os.environ)
        self.log = io.StringIO()
        self.state_dir = None


def test_the_sbom_is_valid_cyclonedx_with_the_lock_the_sdist_the_patch_and_the_toolchain(plan, tmp_path):
    """About 2 s: the probes run this machine's compilers and mpicc."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    action = next(a for a in _actions(plan) if isinstance(a, WriteSbom))
    out = tmp_path / "sbom.cdx.json"
    WriteSbom(str(out), action.spec).execute(_Ctx())
    text = out.read_text()
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    assert error is None, error
    doc = json.loads(text)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6"
    assert doc["metadata"]["component"]["name"] == "pytorch/2.3.1-gpu"
    by_ref = {c["bom-ref"]: c for c in doc["components"]}
    assert by_ref["pypi:torch==2.3.1"]["purl"] == "pkg:pypi/torch@2.3.1"
    assert len(by_ref) >= len(read_lock(str(LOCK))) + 3
    horovod = by_ref["pypi:horovod==0.28.1"]
    sdist = horovod["externalReferences"][0]
    assert sdist["url"].endswith("horovod-0.28.1.tar.gz")
    assert sdist["hashes"][0]["content"] == "92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0"
    patches = [p["diff"]["text"]["content"] for p in horovod["pedigree"]["patches"]]
    assert len(patches) == 4 and any("C++17" in text for text in patches)
    assert any("GCC 13" in text for text in patches) and any("HOROVOD_CUDA_RUNTIME_LIBRARY" in text for text in patches)
    assert any("NVIDIA/nccl#1950" in text for text in patches)
    patch = LOCK.parent / "patches" / "horovod-0.28.1-cxx17.patch"
    assert by_ref["file:horovod-0.28.1-cxx17.patch"]["hashes"][0]["content"] == sha256_file(patch)
    assert by_ref[f"file:{LOCK.name}"]["hashes"][0]["content"] == sha256_file(LOCK)
    env_tools = {c["name"]: c["version"] for c in doc["components"] if c["bom-ref"].startswith("build-env:")}
    if shutil.which("mpicc"):  # the localhost toolchain: gcc behind Open MPI's wrappers
        assert re.fullmatch(r"\d+\.\d+(\.\d+)?", env_tools["C compiler"]), env_tools
        assert any(name.startswith("MPI (") for name in env_tools), env_tools
    # what dependsOn lists: the stack depends on every package, not on files or tools
    deps = {d["ref"]: d.get("dependsOn", []) for d in doc["dependencies"]}
    assert "pypi:horovod==0.28.1" in deps["stack:pytorch/2.3.1-gpu"]


@pytest.mark.integration
def test_cuda_and_nccl_versions_are_read_from_nvcc_and_nccl_h():
    """The build key's CUDA and NCCL probes of a GPU site (localhost-gpu-build: the CUDA 12.4
    toolkit and NCCL 2.20.5 that scripts/localhost-cuda-toolkit assembles), as the SBOM's spec
    records them, run on the real ``nvcc`` and ``nccl.h``."""
    from hpcstack.install.components.manifest import run_probe

    cuda_home = "/opt/hpcstack/cuda-12.4"
    if not os.access(f"{cuda_home}/bin/nvcc", os.X_OK):
        pytest.skip(f"no CUDA toolkit at {cuda_home}: run scripts/localhost-cuda-toolkit "
                    "(scripts/localhost-setup --with-test-tools does)")
    site = load_site("localhost-gpu-build")
    plan = resolve(load_recipe("pytorch/2.3.1-gpu", site), site, python_version="3.11")
    probes = dict(json.loads(next(a for a in _actions(plan) if isinstance(a, WriteSbom)).spec)["builds"][0]["probes"])
    found = {name: version for name, version, _ in probed_versions(
        {label: run_probe(probes[label], dict(os.environ)) for label in ("CUDA", "NCCL")})}
    assert found["CUDA"].startswith("12.4."), found
    assert found["NCCL"] == "2.20.5"  # the site's NCCL: nvidia-nccl-cu12 2.20.5, torch 2.3.1's own


def test_show_points_to_the_sbom(tmp_path):
    from hpcstack.install import provenance

    state = tmp_path / "build" / ".hpcstack"
    state.mkdir(parents=True)
    (state / "sbom.cdx.json").write_text("{}")
    (state / "constraints.txt").write_text("torch==2.3.1\n")
    text = provenance.render(provenance.describe(tmp_path / "build"))
    assert f"sbom:          {state / 'sbom.cdx.json'} (CycloneDX 1.6 JSON)" in text
    assert f"constraints:   {state / 'constraints.txt'}" in text


# ------------------------------------------------------------------------------ real pip and uv

def _network_env() -> dict[str, str]:
    keep = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "PIP_CERT", "http_proxy", "https_proxy",
            "HTTP_PROXY", "HTTPS_PROXY", "no_proxy", "NO_PROXY")
    return {k: os.environ[k] for k in keep if k in os.environ}


def _module_root(tool, stack, tmp_path: Path, constraints: Path) -> Path:
    """A module root with the modulefile an install writes now, naming ``constraints``."""
    root = tmp_path / f"modules-{tool.syntax}"
    if tool.syntax == "tcl":
        site = load_site("localhost")
        text = render_for_prefix(site, load_recipe("pytorch/2.3.1-gpu", site), str(stack.prefix),
                                 stack.python_version, "tcl")
        name = root / "pytorch" / "2.3.1-gpu"
    else:
        name = stack.roots["lua"] / "pytorch" / "2.3.1-gpu.lua"
        text = name.read_text()
        name = root / "pytorch" / "2.3.1-gpu.lua"
    installed_path = f"{stack.prefix}/.hpcstack/{CONSTRAINTS}"
    assert installed_path in text
    name.parent.mkdir(parents=True, exist_ok=True)
    name.write_text(text.replace(installed_path, str(constraints)))
    return root


@pytest.mark.e2e
@pytest.mark.parametrize("tool", tool_params())
def test_pip_and_uv_in_an_extended_venv_keep_the_stack(tool, plan, tmp_path):
    require(tool)
    lua_root = tmp_path / "lua-render"
    stack = find_installed_stack(lua_root)
    if isinstance(stack, str):
        pytest.skip(stack)
    try:
        import uv

        uv_bin = uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        uv_bin = shutil.which("uv")
    if not uv_bin:
        pytest.skip("no uv (pip install uv)")
    constraints = tmp_path / CONSTRAINTS
    constraints.write_text(constraints_of(plan))
    root = _module_root(tool, stack, tmp_path, constraints)
    home = tmp_path / "home"
    user_site = home / ".local" / "lib" / f"python{stack.python_version}" / "site-packages"
    user_site.mkdir(parents=True)
    (user_site / "hpcstack_usersite_only.py").write_text("")
    (user_site / "torch-9.9.dist-info").mkdir()
    (user_site / "torch-9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 9.9\n")
    venv = tmp_path / "venv"
    script = f"""
module use {root}
module use /opt/hpcstack/base-modulefiles
module load pytorch/2.3.1-gpu || exit 9
# --system-site-packages turns the user site on in a venv: only PYTHONNOUSERSITE keeps it out
python -m venv --system-site-packages {venv} && extend-venv-activate {venv} >/dev/null || exit 8
source {venv}/bin/activate || exit 7
echo "CONSTRAINT=$PIP_CONSTRAINT $UV_CONSTRAINT NOUSERSITE=$PYTHONNOUSERSITE"
python -c 'import hpcstack_usersite_only' 2>/dev/null && echo USERSITE_SEEN || echo USERSITE_HIDDEN
python -c 'import torch; print("TORCH", torch.__version__, torch.__file__)'
echo "=== uv torch>=2.4"; {uv_bin} pip install --dry-run 'torch>=2.4' 2>&1; echo "rc=$?"
echo "=== uv rich"; {uv_bin} pip install --dry-run rich 2>&1; echo "rc=$?"
echo "=== uv torchvision"; {uv_bin} pip install --dry-run torchvision 2>&1; echo "rc=$?"
echo "=== pip torchvision"; python -m pip install torchvision 2>&1; echo "rc=$?"
echo "=== pip torch>=2.4"; python -m pip install 'torch>=2.4' 2>&1; echo "rc=$?"
echo "=== pip rich"; python -m pip install rich 2>&1; echo "rc=$?"
echo "=== end"
"""
    env = {"HOME": str(home), "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_NO_INPUT": "1", **_network_env()}
    proc = tool.bash(script, env=env, modulepath="", timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    sections = dict(re.findall(r"=== (.+?)\n(.*?)(?==== )", out, re.S))
    assert f"CONSTRAINT={constraints} {constraints} NOUSERSITE=1" in out
    assert "USERSITE_HIDDEN" in out, out[:2000]
    # the stack's torch, by the link's path or (through the venv's start-up file) by the build's real one
    real = os.path.realpath(stack.prefix)
    assert re.search(rf"TORCH 2\.3\.1\S* ({re.escape(str(stack.prefix))}|{re.escape(real)})/venv/lib/", out), out[:2000]
    # uv cannot see the stack (it reads only the venv's site-packages), but it keeps to the pins
    assert "rc=0" not in sections["uv torch>=2.4"], sections["uv torch>=2.4"]
    assert "torch==2.3.1" in sections["uv torch>=2.4"] and "unsatisfiable" in sections["uv torch>=2.4"]
    assert "rc=0" in sections["uv rich"] and "+ rich==" in sections["uv rich"]
    uv_tv = sections["uv torchvision"]
    assert "rc=0" in uv_tv and "+ torch==2.3.1" in uv_tv and "+ torchvision==0.18.1" in uv_tv, uv_tv
    # pip sees the stack through PYTHONPATH: nothing new, a conflict naming the pin, rich installs
    assert "rc=0" in sections["pip torchvision"], sections["pip torchvision"]
    assert "Requirement already satisfied: torchvision" in sections["pip torchvision"]
    assert "Successfully installed" not in sections["pip torchvision"]
    conflict = sections["pip torch>=2.4"]
    assert "rc=0" not in conflict and "The user requested (constraint) torch==2.3.1" in conflict, conflict
    assert "rc=0" in sections["pip rich"] and "Successfully installed" in sections["pip rich"]
    site = next((venv / "lib").glob("python*/site-packages"))
    assert not list(site.glob("torch-*.dist-info")) and not list(site.glob("torchvision-*"))
    assert list(site.glob("rich-*.dist-info"))
    # hpcstack doctor: the venv is clean; the fake torch in ~/.local is reported
    doc = hpcstack("doctor", "--venv", str(venv), "--stack", str(stack.prefix), env={"HOME": str(home)})
    assert doc.returncode == 1, doc.stdout + doc.stderr
    lines = doc.stdout.splitlines()
    assert lines == [f"user site: torch 9.9 in {user_site} is imported by any Python without "
                     f"PYTHONNOUSERSITE=1 (the stack or venv has 2.3.1)",
                     "note: on pytorch/2.3.1-gpu, which `module load pytorch` loads (the default)"], lines


# ------------------------------------------------------------------------------ hpcstack doctor

def _dist(site: Path, name: str, version: str, *requires: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    body = "".join(f"Requires-Dist: {r}\n" for r in requires)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{body}")


@pytest.fixture()
def stack_prefix(tmp_path):
    """A small stack prefix: a real venv with two distributions and a constraints file."""
    import subprocess
    import sys

    prefix = tmp_path / "stack"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix / "venv")], check=True)
    site = next((prefix / "venv" / "lib").glob("python*/site-packages"))
    _dist(site, "torch", "2.3.1")
    _dist(site, "numpy", "1.26.4")
    (prefix / ".hpcstack").mkdir()
    (prefix / ".hpcstack" / "constraints.txt").write_text("torch==2.3.1\nnumpy==1.26.4\nhorovod==0.28.1\n")
    return prefix


def test_doctor_lists_each_problem_and_exits_1(stack_prefix, tmp_path):
    import subprocess
    import sys

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # a venv without pip of its own (as `uv venv` makes) is one problem
    bare = hpcstack("doctor", "--venv", str(venv), "--stack", str(stack_prefix), env={"HOME": str(tmp_path)})
    assert bare.returncode == 1 and bare.stdout.startswith(f"no pip: {venv} has no pip of its own"), bare.stdout
    (venv / "bin" / "pip").write_text("#!/bin/sh\n")  # stands for the pip that `python -m venv` puts there
    clean = hpcstack("doctor", "--venv", str(venv), "--stack", str(stack_prefix), env={"HOME": str(tmp_path)})
    assert clean.returncode == 0 and clean.stdout.startswith("ok: "), clean.stdout + clean.stderr
    site = next((venv / "lib").glob("python*/site-packages"))
    _dist(site, "Torch", "2.4.0")
    _dist(site, "horovod", "0.27.0")
    _dist(site, "mylib", "1.0", "numpy>=2", "torch>=2", "extra-thing; extra == 'x'")
    user = tmp_path / ".local" / "lib" / site.parent.name / "site-packages"
    _dist(user, "numpy", "2.0.0")
    proc = hpcstack("doctor", "--venv", str(venv), "--stack", str(stack_prefix), env={"HOME": str(tmp_path)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    stack_site = next((stack_prefix / "venv" / "lib").glob("python*/site-packages"))
    assert lines == [
        f"shadows: torch 2.4.0 in {site} hides the stack's torch 2.3.1 ({stack_site})",
        f"conflict: horovod 0.27.0 in {site} breaks the stack's constraint horovod==0.28.1 "
        f"({stack_prefix / '.hpcstack' / 'constraints.txt'})",
        "conflict: mylib 1.0 requires numpy>=2; the stack has numpy 1.26.4",
        f"user site: numpy 2.0.0 in {user} is imported by any Python without PYTHONNOUSERSITE=1 "
        "(the stack or venv has 1.26.4)",
    ], lines


def test_doctor_without_a_stack_says_so_and_exits_2(tmp_path):
    env = {k: "" for k in os.environ if re.fullmatch(r"HPCSTACK_[A-Z0-9_]+_ROOT", k)}
    proc = hpcstack("doctor", env={"VIRTUAL_ENV": "", "PATH": BASE_PATH, **env})
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: no stack: load its module (HPCSTACK_<NAME>_ROOT) or give --stack PREFIX"]


def test_doctor_reads_a_venvs_retired_stack_through_the_gate(tmp_path):
    """doctor --venv DIR with no stack reads DIR/bin/activate, each module root's deprecation
    record and stand-in modulefile before anything is checked (issue 45): through the gate, so
    a FIFO put there neither blocks nor is read (it hung the command), and a link where another
    account could have put it, or a directory it can change, is not followed or read."""
    from blocking import returns_on_fifo
    from hpcstack import doctor
    from hpcstack.lifecycle.deprecation import RETIRED_MARKER

    venv, mf = tmp_path / "venv", tmp_path / "mf"
    (venv / "bin").mkdir(parents=True)
    (mf / "tiny").mkdir(parents=True)
    (mf / ".hpcstack").mkdir()
    activate, record, stand_in = venv / "bin" / "activate", mf / ".hpcstack" / "deprecations.json", mf / "tiny" / "1.0"
    texts = {activate: "# >>> hpcstack tiny/1.0 >>>\n# >>> hpcstack ../../x >>>\n",
             record: json.dumps({"modules": {"tiny/1.0": {"replacement": "tiny/2.0"}}}),
             stand_in: RETIRED_MARKER + "\n"}
    for path, text in texts.items():
        path.write_text(text)
    env = {"MODULEPATH": str(mf)}
    (line,) = doctor.retired_stack_lines(venv, env)
    assert line.startswith("tiny/1.0 was retired: use tiny/2.0 instead; rebuild this venv on it"), line
    for path, text in texts.items():
        path.unlink()
        os.mkfifo(path)
        assert returns_on_fifo(lambda: doctor.retired_stack_lines(venv, env), path) == [], path
        path.unlink()
        path.write_text(text)
    # the venv's bin/ writable by every user: its activate, or a link there, is not read
    (venv / "bin").chmod(0o777)
    assert doctor.retired_stack_lines(venv, env) == []
    (venv / "bin").chmod(0o755)
    activate.rename(tmp_path / "activate")
    open_ = tmp_path / "open"
    open_.mkdir()
    open_.chmod(0o777)
    (open_ / "activate").symlink_to(tmp_path / "activate")
    activate.symlink_to(open_ / "activate")
    assert activate.read_text() == texts[activate]          # control: by name, the links lead to it
    assert doctor.retired_stack_lines(venv, env) == []


def test_doctor_without_a_venv_checks_the_user_site_of_the_stacks_python(stack_prefix, tmp_path):
    """No venv active: what `pip install --user` left in ~/.local (hidden under the module, seen by
    every other Python of that version) is reported; an empty user site is ok."""
    env = {"HOME": str(tmp_path), "VIRTUAL_ENV": "", "PYTHONUSERBASE": ""}
    clean = hpcstack("doctor", "--stack", str(stack_prefix), env=env)
    assert clean.returncode == 0 and clean.stdout.startswith("ok: no venv active; checked the user site "), clean.stdout
    version = next((stack_prefix / "venv" / "lib").glob("python*")).name
    user = tmp_path / ".local" / "lib" / version / "site-packages"
    _dist(user, "tqdm", "4.66.0")
    _dist(user, "numpy", "2.0.0")
    proc = hpcstack("doctor", "--stack", str(stack_prefix), env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        f"user site: numpy 2.0.0 in {user} is imported by any Python without PYTHONNOUSERSITE=1 "
        "(the stack or venv has 1.26.4)",
        f"user site: tqdm 4.66.0 in {user} is imported by any Python without PYTHONNOUSERSITE=1"]


# ------------------------------------------------------------------------------ a real install

@pytest.mark.integration
@pytest.mark.parametrize("tool", [p for p in tool_params() if p.id == "modules"])
def test_an_install_writes_constraints_and_sbom_and_its_module_holds_pip_to_them(tool, tmp_path, localhost_ready):
    """The tiny recipe with StackManifest, installed for real for localhost; then pip in an
    extended venv under the modulefile the install wrote. About 50 s (Lmod: the same with
    ``localhost-lmod``; left out to keep CI short, since the test on the installed stack above runs
    pip and uv under both tools with the Lua modulefile an install writes)."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    from conftest import make_sdist, write_tiny_recipe

    require(tool)
    recipe = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    text = recipe.read_text().replace("StackTools,\n", "StackManifest, StackTools,\n")
    assert "        Imports((" in text
    recipe.write_text(text.replace("        Imports((", "        StackManifest(),\n        Imports(("))
    site = "localhost-lmod" if tool.syntax == "lua" else "localhost"
    proc = hpcstack("install", str(recipe), "--site", site, "--prefix", str(tmp_path / "sw"),
                    "--module-root", str(tmp_path / "mf"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    prefix = tmp_path / "sw" / "tiny" / "1.0"
    constraints = prefix / ".hpcstack" / CONSTRAINTS
    lines = constraints.read_text().splitlines()
    assert {"six==1.16.0", "wheel==0.43.0", "setuptools==72.1.0", "tinypkg==1.0"} <= set(lines), lines
    sbom = (prefix / ".hpcstack" / "sbom.cdx.json").read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(sbom) is None
    assert {"six", "tinypkg", "tiny.patch"} <= {c["name"] for c in json.loads(sbom)["components"]}
    show = hpcstack("show", str(prefix))
    assert f"sbom:          {os.path.realpath(prefix)}/.hpcstack/sbom.cdx.json" in show.stdout, show.stdout
    venv = tmp_path / "venv"
    script = f"""
module use {tmp_path / 'mf'}
module use /opt/hpcstack/base-modulefiles
module load tiny/1.0 || exit 9
python -m venv {venv} && extend-venv-activate {venv} >/dev/null || exit 8
source {venv}/bin/activate || exit 7
echo "CONSTRAINT=$PIP_CONSTRAINT NOUSERSITE=$PYTHONNOUSERSITE"
echo "=== pip six"; python -m pip install six 2>&1; echo "rc=$?"
echo "=== pip six>=1.17"; python -m pip install 'six>=1.17' 2>&1; echo "rc=$?"
echo "=== doctor"; hpcstack-doctor 2>&1; echo "rc=$?"
echo "=== end"
"""
    env = {"HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           **_network_env()}
    run = tool.bash(script, env=env, modulepath="", timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    sections = dict(re.findall(r"=== (.+?)\n(.*?)(?==== )", run.stdout, re.S))
    assert f"CONSTRAINT={prefix}/.hpcstack/{CONSTRAINTS} NOUSERSITE=1" in run.stdout
    assert "rc=0" in sections["pip six"] and "Requirement already satisfied: six" in sections["pip six"]
    assert "rc=0" not in sections["pip six>=1.17"]
    assert "The user requested (constraint) six==1.16.0" in sections["pip six>=1.17"], sections["pip six>=1.17"]
    # the stack's own hpcstack-doctor (no hpcstack command needed): the venv is clean
    doctor = sections["doctor"].splitlines()
    # which stack the venv is on, then the verdict (hpcstack-doctor prints notes before "ok:")
    assert doctor[0] == "note: on tiny/1.0, which `module load tiny` loads (the default)", doctor
    assert doctor[1].startswith(f"ok: checked {venv} on top of {prefix}:"), doctor
    assert "rc=0" in sections["doctor"]


def test_the_dry_run_line_writes_the_same_sbom(plan, tmp_path):
    """``hpcstack action sbom`` (what the dry-run prints) and the real run give the same components."""
    import shlex
    import subprocess

    action = next(a for a in _actions(plan) if isinstance(a, WriteSbom))
    WriteSbom(str(tmp_path / "a.json"), action.spec).execute(_Ctx())
    words = shlex.split(WriteSbom(str(tmp_path / "b.json"), action.spec).to_bash())
    assert words[:3] == ["hpcstack", "action", "sbom"]
    proc = subprocess.run([*__import__("conftest").HPCSTACK, *words[1:]], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    assert a["components"] == b["components"] and a["dependencies"] == b["dependencies"]


@pytest.mark.integration
def test_a_loaded_stacks_uv_constraint_does_not_hold_a_relock(tmp_path):
    """``hpcstack lock`` under a loaded stack module (UV_CONSTRAINT set): the re-lock resolves
    freely. About 15 s (uv resolves ``six`` on PyPI)."""
    from conftest import make_sdist, write_tiny_recipe

    recipe = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    (recipe.parent / "1.0.in").write_text("six\n")
    old = tmp_path / "constraints.txt"
    old.write_text("six==1.15.0\n")
    import sys

    # `hpcstack lock` runs the uv on PATH: the one installed with hpcstack
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    proc = hpcstack("lock", str(recipe), "--site", "localhost", env={"UV_CONSTRAINT": str(old), "PATH": path})
    assert proc.returncode == 0, proc.stderr
    pins = {(p.name, p.version) for p in read_lock(str(recipe.parent / "1.0.pypi.lock"))}
    assert [v for n, v in pins if n == "six"] and ("six", "1.15.0") not in pins, pins
