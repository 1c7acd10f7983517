"""``hpcstack export … --format easyconfig``: the recipe as an EasyBuild easyconfig.

The localhost export is read back by the real EasyBuild (easybuild-framework and
easybuild-easyblocks, test extras): it parses (``EasyConfig``), passes ``eb --check-contrib``
(EasyBuild's style check and its check that every source has a sha256), and ``eb --dry-run``
resolves it against a robot path holding a minimal easyconfig for the localhost site's Python
module. The export reads PyPI's simple API for the file names (about 3 s); the EasyBuild runs take
about 3 s each. Offline pieces: the lock parser, wheel choice, dependency names, line wrapping,
an unreachable index and bad command lines.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MODULES_INIT, REPO, hpcstack, site_overlay

pytestmark = pytest.mark.unit

RECIPE = "pytorch/2.3.1-gpu"
LOCK = REPO / "recipes" / "pytorch" / "2.3.1-gpu.pypi.lock"
BIN = Path(sys.executable).parent
EB = shutil.which("eb", path=os.pathsep.join([str(BIN), os.environ.get("PATH", "")]))


# ----------------------------------------------------------------------------- offline pieces

def test_lock_pins_keep_version_marker_hashes_and_index():
    from hpcstack.export.pins import applies, read_lock

    pins = {p.name: p for p in read_lock(str(LOCK))}
    torch = pins["torch"]
    assert torch.version == "2.3.1" and torch.index == "https://pypi.org/simple" and len(torch.hashes) > 5
    # the marker as the lock writes it (the constraints file repeats it as is)
    assert pins["colorama"].marker == "sys_platform == 'win32'" and not applies(pins["colorama"], "3.11")
    assert applies(pins["nvidia-cublas-cu12"], "3.12") and applies(torch, "3.11")
    cu121 = {p.name: p for p in read_lock(str(LOCK.with_name("2.3.1-gpu.cu121.lock")))}
    assert cu121["torch"].version == "2.3.1+cu121" and cu121["torch"].index == "https://download.pytorch.org/whl/cu121"


def test_the_wheel_the_site_installs_is_picked_else_the_sdist():
    from hpcstack.export.pins import Pin, pick

    pin = Pin("numpy", "1.26.4", None, frozenset({"a", "b", "c", "d"}), "https://pypi.org/simple")
    files = [("numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "u/1", "a"),
             ("numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "u/2", "b"),
             ("numpy-1.26.4-cp312-cp312-musllinux_1_1_x86_64.whl", "u/3", "c"),
             ("numpy-1.26.4-cp312-cp312-manylinux_2_17_aarch64.whl", "u/4", "x"),  # not in the lock
             ("numpy-1.26.4.tar.gz", "u/5", "d")]
    assert pick(pin, files, "3.12").filename.startswith("numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64")
    assert pick(pin, files, "3.11").sha256 == "b"
    assert pick(pin, files, "3.10").filename == "numpy-1.26.4.tar.gz"
    assert pick(pin, [("numpy-1.26.4.tar.gz", "u/5", "z")], "3.12") is None


@pytest.mark.parametrize("module, python, expected", [
    ("python/3.12.1-gpu", "3.12", ("Python", "3.12.1", "-gpu")),
    ("python", "3.11", ("Python", "3.11")),
    ("cmake/3.25.2", "3.12", ("CMake", "3.25.2")),
    ("PrgEnv-gnu/8.5.0", "3.11", ("PrgEnv-gnu", "8.5.0")),
])
def test_site_modules_become_easybuild_dependencies(module, python, expected):
    from hpcstack.export.easyconfig import easybuild_dependency

    assert easybuild_dependency(module, python) == expected


def test_long_strings_are_split_into_adjacent_literals_that_join_back():
    from hpcstack.export.easyconfig import pywrap

    text = "CC=mpicc CXX=mpicxx " + " ".join(f"HOROVOD_SETTING_{i}=1" for i in range(12))
    wrapped = pywrap(text, 8, 26)
    assert wrapped.startswith("(\n") and all(len(line) <= 100 for line in wrapped.splitlines())
    assert eval(wrapped) == text                                  # noqa: S307 - our own literal
    assert pywrap("short") == "'short'"


def test_an_unreachable_index_fails_with_one_line_and_writes_nothing(tmp_path):
    repo = tmp_path / "repo" / "recipes" / "pytorch"
    shutil.copytree(REPO / "recipes" / "pytorch", repo, ignore=shutil.ignore_patterns("__pycache__"))
    lock = repo / "2.3.1-gpu.pypi.lock"
    lock.write_text(lock.read_text().replace("https://pypi.org/simple", "http://127.0.0.1:9/simple"))
    site_overlay(tmp_path / "repo", roots=tmp_path / "roots")  # localhost stating its Python: no module loads
    out = tmp_path / "out" / "x.eb"
    proc = hpcstack("export", RECIPE, "--site", "localhost", "--repo", str(tmp_path / "repo"),
                    "--format", "easyconfig", "-o", str(out))
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: cannot read http://127.0.0.1:9/simple/") and "Traceback" not in proc.stderr
    assert not out.parent.exists()


@pytest.mark.integration  # the export reads the index (PyPI) before it looks at -o
def test_easyconfig_needs_an_output_file_for_its_patches():
    proc = hpcstack("export", RECIPE, "--site", "localhost", "--format", "easyconfig")
    assert proc.returncode == 2
    assert ("give -o FILE (its horovod-0.28.1-cxx17.patch, horovod-0.28.1-gcc13-cmake4.patch, "
            "horovod-0.28.1-cuda-runtime.patch, horovod-0.28.1-onerank-avg.patch go next to "
            "it)") in proc.stderr
    assert proc.stdout == ""


# ----------------------------------------------------------------------------- real EasyBuild

def _eb_env(tmp: Path) -> dict:
    """EasyBuild's environment: its prefix and an empty module path of the test's own (``MODULEPATH``
    set, so the tool's init does not add the machine's module roots, where the README's main
    command published ``pytorch/2.3.1-gpu``: eb would then report it as installed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("BASH_ENV", "LOADEDMODULES", "_LMFILES_")}
    (tmp / "no-modules").mkdir(exist_ok=True)
    env.update({"PATH": f"{BIN}:{env.get('PATH', '')}", "EASYBUILD_MODULES_TOOL": "EnvironmentModules",
                "EASYBUILD_MODULE_SYNTAX": "Tcl", "EASYBUILD_PREFIX": str(tmp / "eb"),
                "MODULEPATH": str(tmp / "no-modules")})
    if os.geteuid() == 0:
        env["EASYBUILD_ALLOW_USE_AS_ROOT_AND_ACCEPT_CONSEQUENCES"] = "1"
    return env


def _in_modules_shell(command: str, tmp: Path) -> subprocess.CompletedProcess:
    """Run ``command`` in bash with Environment Modules initialised (EasyBuild needs a modules tool)."""
    return subprocess.run(["bash", "--norc", "--noprofile", "-c", f"source {MODULES_INIT} && {command}"],
                          capture_output=True, text=True, env=_eb_env(tmp), cwd=tmp, timeout=300)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, localhost_ready):
    if EB is None:
        pytest.skip("eb missing (pip install easybuild-framework easybuild-easyblocks; the test extras have them)")
    tmp = tmp_path_factory.mktemp("easyconfig")
    out = tmp / "pytorch-2.3.1-gpu.eb"
    proc = hpcstack("export", RECIPE, "--site", "localhost", "--format", "easyconfig", "-o", str(out))
    if proc.returncode == 1 and "cannot read https://pypi.org/simple/" in proc.stderr:
        pytest.skip(f"PyPI cannot be reached: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {tmp / 'horovod-0.28.1-cxx17.patch'}" in proc.stderr
    # the localhost site's Python module, python/X.Y, as a minimal easyconfig on the robot path
    (python,) = re.findall(r"^    \('Python', '([0-9.]+)'\),$", out.read_text(), re.M)
    robot = tmp / "robot"
    robot.mkdir()
    (robot / f"Python-{python}.eb").write_text(
        "easyblock = 'Bundle'\n\nname = 'Python'\nversion = '%s'\n\nhomepage = 'https://www.python.org'\n"
        "description = \"The machine's Python, as the localhost site's python/%s module gives it\"\n\n"
        "toolchain = SYSTEM\n\nmoduleclass = 'lang'\n" % (python, python))
    return tmp, out, robot, python


READ = """
import json, sys
from easybuild.tools.options import set_up_configuration
set_up_configuration(args=[], silent=True)
from easybuild.framework.easyconfig.easyconfig import EasyConfig
ec = EasyConfig(sys.argv[1])
keys = ['easyblock', 'name', 'version', 'versionsuffix', 'exts_list', 'sanity_check_commands',
        'sanity_check_paths', 'modextrapaths', 'exts_default_options', 'sanity_pip_check']
values = {k: ec[k] for k in keys if k != 'modextravars'}
with ec.disable_templating():      # %(installdir)s is known only during an installation
    values['modextravars'] = ec['modextravars']
    values['postinstallcmds'] = ec['postinstallcmds']
print(json.dumps({**values, 'dependencies': [(d['name'], d['version']) for d in ec.dependencies()]}))
"""


@pytest.fixture(scope="module")
def parsed(exported):
    tmp, out, _, _ = exported
    (tmp / "read_easyconfig.py").write_text(READ)
    proc = _in_modules_shell(f"{BIN / 'python'} read_easyconfig.py {out}", tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.integration
def test_easyconfig_parses_with_every_applicable_pin_as_an_extension(exported, parsed):
    from hpcstack.export.pins import applies, read_lock

    _, _, _, python = exported
    assert (parsed["easyblock"], parsed["name"], parsed["version"], parsed["versionsuffix"]) == \
        ("PythonBundle", "pytorch", "2.3.1", "-gpu")
    assert parsed["dependencies"] == [["Python", python]]
    pins = [p for p in read_lock(str(LOCK)) if applies(p, python)]
    exts = {e[0]: e for e in parsed["exts_list"]}
    assert [e[0] for e in parsed["exts_list"]] == [p.name for p in pins] + ["horovod"]
    for pin in pins:
        name, version, options = exts[pin.name]
        assert version == pin.version
        (checksum,) = options["checksums"]
        assert checksum in pin.hashes
        (source,) = options["sources"]
        assert re.sub(r"[-_.]+", "_", source.lower()).startswith(re.sub(r"[-_.]+", "_", pin.name.lower())), source
        assert options["source_urls"][0].startswith("https://files.pythonhosted.org/packages/")
    assert exts["torch"][2]["sources"] == [f"torch-2.3.1-cp{python.replace('.', '')}-cp{python.replace('.', '')}-manylinux1_x86_64.whl"]
    assert "colorama" not in exts                                 # win32 only
    assert parsed["exts_default_options"] == {"easyblock": "PythonPackage", "modulename": False}
    assert parsed["sanity_pip_check"] is True


@pytest.mark.integration
def test_horovod_comes_from_its_sdist_with_the_patch_and_the_build_settings(exported, parsed):
    name, version, options = parsed["exts_list"][-1]
    assert (name, version) == ("horovod", "0.28.1")
    patches = ["horovod-0.28.1-cxx17.patch", "horovod-0.28.1-gcc13-cmake4.patch",
               "horovod-0.28.1-cuda-runtime.patch", "horovod-0.28.1-onerank-avg.patch"]
    assert options["sources"] == ["horovod-0.28.1.tar.gz"] and options["patches"] == patches
    texts = {p: (REPO / "recipes" / "pytorch" / "patches" / p).read_bytes() for p in patches}
    assert options["checksums"] == [
        {"horovod-0.28.1.tar.gz": "92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0"},
        *({p: hashlib.sha256(texts[p]).hexdigest()} for p in patches)]
    tmp = exported[0]
    for p in patches:
        assert (tmp / p).read_bytes() == texts[p]   # EasyBuild finds them there
    for setting in ("CC=mpicc", "CXX=mpicxx", "HOROVOD_WITH_PYTORCH=1", "HOROVOD_WITH_MPI=1", "HOROVOD_WITH_GLOO=1",
                    "HOROVOD_CPU_OPERATIONS=MPI", "HOROVOD_WITHOUT_CUDA=1", "HOROVOD_WITHOUT_TENSORFLOW=1"):
        assert setting in options["preinstallopts"].split(), setting


@pytest.mark.integration
def test_sanity_check_and_module_environment_match_the_recipe_and_modulefile(exported, parsed):
    python = exported[3]
    commands = parsed["sanity_check_commands"]
    assert commands[0].startswith("python -c 'import torch; import torchvision;") and "import horovod.torch" in commands[0]
    assert commands[1:] == [f"horovodrun --check-build | grep -F '[X] {flag}'" for flag in ("PyTorch", "MPI", "Gloo")]
    assert parsed["sanity_check_paths"]["files"] == ["bin/horovodrun"]
    assert parsed["modextrapaths"] == {"PATH": ["bin"], "PYTHONPATH": [f"lib/python{python}/site-packages"]}
    constraints = "%(installdir)s/.hpcstack/constraints.txt"
    assert parsed["modextravars"] == {"HPCSTACK_PYTORCH_ROOT": "%(installdir)s", "PYTHONNOUSERSITE": "1",
                                      "PIP_CONSTRAINT": constraints, "UV_CONSTRAINT": constraints,
                                      "SLURM_MPI_TYPE": "pmix"}   # the site's modules.env
    # the file they name is written after the install, with every pin (constraints.txt)
    (command,) = parsed["postinstallcmds"]
    assert command.endswith(" werkzeug==3.0.3 wheel==0.43.0 horovod==0.28.1")   # shell words
    assert command.startswith("mkdir -p %(installdir)s/.hpcstack && printf '%%s\\n' > " + constraints)
    assert " torch==2.3.1 " in command


@pytest.mark.integration
def test_easyconfig_passes_easybuilds_contribution_checks(exported):
    tmp, out, _, _ = exported
    proc = _in_modules_shell(f"eb --check-contrib {out}", tmp)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "All style checks PASSed!" in output and "All SHA256 checksums checks PASSed!" in output


@pytest.mark.integration
def test_eb_dry_run_resolves_the_dependencies_on_the_robot_path(exported):
    tmp, out, robot, python = exported
    proc = _in_modules_shell(f"eb {out} --dry-run --robot={robot}", tmp)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    # eb wraps its lines at 80 columns, at a space or inside a word (where depends on the length
    # of the temporary paths): compared without any white space
    joined = re.sub(r"\s+", "", output)
    for line in (f"* [ ] {robot}/Python-{python}.eb (module: Python/{python})",
                 f"* [ ] {out} (module: pytorch/2.3.1-gpu)"):
        assert re.sub(r"\s+", "", line) in joined, output


# ----------------------------------------------------------------------------- a GPU site

@pytest.fixture
def cirrus_export(tmp_path):
    """cirrus's export from a local simple index (PEP 503 HTML pages, served over HTTP) that holds
    a cp312 manylinux wheel for every pin of the cu121 lock: the PyTorch index cannot be reached
    from every test machine. The recipe comes from a repository copy whose lock names that index."""
    import functools
    import http.server
    import threading

    from hpcstack.export.pins import read_lock

    lock = LOCK.with_name("2.3.1-gpu.cu121.lock")
    index = tmp_path / "index"
    for pin in read_lock(str(lock)):
        page = index / "simple" / re.sub(r"[-_.]+", "-", pin.name).lower()
        page.mkdir(parents=True)
        wheel = f"{re.sub(r'[-_.]+', '_', pin.name)}-{pin.version}-cp312-cp312-manylinux_2_17_x86_64.whl"
        sha = sorted(pin.hashes)[0]
        (page / "index.html").write_text(f'<a href="/files/{wheel.replace("+", "%2B")}#sha256={sha}">{wheel}</a>\n')
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(index)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/simple"
    repo = tmp_path / "repo" / "recipes" / "pytorch"
    shutil.copytree(REPO / "recipes" / "pytorch", repo, ignore=shutil.ignore_patterns("__pycache__"))
    text = (repo / lock.name).read_text()
    (repo / lock.name).write_text(text.replace("https://download.pytorch.org/whl/cu121", url)
                                  .replace("https://pypi.org/simple", url))
    out = tmp_path / "eb" / "pytorch-2.3.1-gpu.eb"
    proc = hpcstack("export", RECIPE, "--site", "cirrus", "--repo", str(tmp_path / "repo"), "--format",
                    "easyconfig", "-o", str(out), env={"no_proxy": "127.0.0.1", "NO_PROXY": "127.0.0.1"})
    server.shutdown()
    assert proc.returncode == 0, proc.stderr
    return out, url, read_lock(str(lock))


def test_cirrus_easyconfig_builds_horovod_with_nccl_against_the_sites_modules(cirrus_export):
    out, url, pins = cirrus_export
    text = out.read_text()
    assert "('Python', '3.12.1', '-gpu')," in text and "builddependencies = [\n    ('CMake', '3.25.2'),\n]" in text
    assert "the lock file 2.3.1-gpu.cu121.lock that apply to CPython 3.12" in text
    # the +cu121 wheels, their URLs with %2B escaped for EasyBuild's templates
    assert "('torch', '2.3.1+cu121', {" in text
    assert f"'source_urls': ['{url.rsplit('/', 1)[0]}/files/']," in text
    assert ("'sources': [{\n            'filename': 'torch-2.3.1+cu121-cp312-cp312-manylinux_2_17_x86_64.whl',\n"
            "            'download_filename': 'torch-2.3.1%%2Bcu121-cp312-cp312-manylinux_2_17_x86_64.whl',\n"
            "        }],") in text
    preinstall = "".join(re.findall(r"^\s+'(.*)'$", text.split("'preinstallopts': (")[1].split("),")[0], re.M))
    # each value one shell word; ${NAME} references to the build environment stay live
    for setting in ("HOROVOD_GPU=CUDA", "HOROVOD_GPU_OPERATIONS=NCCL", 'HOROVOD_CUDA_HOME="${NVHPC_ROOT}/cuda/12.4"',
                    'HOROVOD_NCCL_HOME="${NVHPC_ROOT}/comm_libs/nccl"', "HOROVOD_BUILD_CUDA_CC_LIST=70",
                    "MAKEFLAGS=-j8", 'ln -sfn "${NVHPC_ROOT}/cuda/lib64/stubs/libcuda.so" %(builddir)s/cuda-stubs/libcuda.so.1'):
        assert setting in preinstall, setting
    import ast

    commands = next(ast.literal_eval(node.value) for node in ast.parse(text).body
                    if isinstance(node, ast.Assign) and node.targets[0].id == "sanity_check_commands")
    stubs = 'LD_LIBRARY_PATH=%(builddir)s/cuda-stubs:"${NVHPC_ROOT}/cuda/lib64/stubs":$LD_LIBRARY_PATH '
    assert commands[1:] == [f"{stubs}horovodrun --check-build | grep -F '[X] {flag}'"
                            for flag in ("PyTorch", "MPI", "Gloo", "NCCL")]
    assert commands[0].startswith(f"{stubs}python -c 'import torch;")
    assert "modextrapaths = {'PATH': ['bin'], 'PYTHONPATH': ['lib/python%(pyshortver)s/site-packages']}" in text
    from hpcstack.export.pins import applies

    extensions = re.findall(r"^    \('([^']+)', '([^']+)', \{$", text, re.M)
    assert extensions == [(p.name, p.version) for p in pins if applies(p, "3.12")] + [("horovod", "0.28.1")]
    assert "('colorama'" not in text                                    # win32 only


@pytest.mark.integration
def test_cirrus_easyconfig_passes_easybuilds_style_check(cirrus_export, tmp_path):
    if EB is None or not MODULES_INIT.is_file():
        pytest.skip("eb or Environment Modules missing (test extras; scripts/localhost-setup)")
    out = cirrus_export[0]
    proc = _in_modules_shell(f"eb --check-contrib {out}", tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
