"""The jax recipes: a third framework through the same machinery, with 0 lines of its own under
hpcstack/.

* ``jax/0.10.2-gpu``: dry runs for every shipped GPU site (conftest's ``gpu_sites()``) against
  golden files (conftest's ``REGENERATE`` makes them): the validation job scripts, and the install
  plan, or the preflight's refusal where hpcstack refuses the site (none today); cirrus (V100,
  7.0) accepted because the recorded plugin wheels carry SASS sm_70, and refused, with the reason,
  where the record says they start at sm_75 (as the CUDA 13 wheels do); a CPU site refused (no
  lock fits); the sanity half of the GPU-architecture check (``jax-gpu-archs``) on the real plugin
  wheel unpacked into a venv;
* ``jax/0.10.2-cpu``: a real install on localhost into a temporary prefix (the machine's caches),
  ``module load``, ``hpcstack validate --local`` on 2 ranks, the ``corrupted`` workload that must
  fail, and the Slurm jobs on the local 2-node cluster;
* ``hpcstack lock``: uv's error lines, one ``error:`` line each, naming ``min_python``, with
  hpcstack's own uv (not one on PATH).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import hpcstack as package
from conftest import (assert_site_golden, gpu_sites, hpcstack, preflight_refusal, site_overlay, two_node_cluster,
                      user_writable_dir)
from hpcstack.fsutil import current_user
from moduletools import ENVIRONMENT_MODULES, require

CPU = "jax/0.10.2-cpu"
GPU = "jax/0.10.2-gpu"
GOLDEN = Path(__file__).parent / "golden"
DATA_DIR = str(Path(package.__file__).resolve().parent / "data")
RECIPE_DIR = Path(DATA_DIR) / "recipes" / "jax"


def normalise(text: str) -> str:
    text = text.replace(DATA_DIR, "@HPCSTACK_DATA@")
    text = text.replace(f" -user {current_user()} ", " -user @USER@ ")  # whoever runs the tests
    text = re.sub(r"[^\s=]*/hpcstack-validate-jax-0\.10\.2-gpu-\d{8}-\d{6}", "@VALIDATION_DIR@", text)
    text = re.sub(r"(?<=\s)[^\s=]*/uv(?= pip | build )", "@UV@", text)
    return re.sub(r"(?<![0-9a-f])[0-9a-f]{12}(?![0-9a-f])", "@BUILD@", text)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


# ----------------------------------------------------------------------------- GPU: dry runs


@pytest.mark.unit
@pytest.mark.parametrize("site", gpu_sites())
@pytest.mark.parametrize("command", ["install", "validate"])
def test_gpu_dry_run_matches_the_golden_file(site, command):
    proc = hpcstack(command, GPU, "--site", site, "--dry-run")
    if command == "install" and preflight_refusal(GPU, site):
        # the site's GPUs or driver do not run the locked wheels: one line each, nothing written
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout[-2000:] + proc.stderr
        assert_site_golden(GOLDEN / f"jax-0.10.2-gpu-{site}-preflight.txt", normalise(proc.stderr), site)
        return
    assert proc.returncode == 0, proc.stderr
    got = normalise(proc.stdout)
    assert_site_golden(GOLDEN / f"jax-0.10.2-gpu-{site}-{command}.sh", got, site)
    if command == "install":
        # the plan itself, also where the site builds in a batch job (build.batch_job: the dry run
        # above shows the job step)
        plan = hpcstack(command, GPU, "--site", site, "--dry-run", "--on-login-node")
        assert plan.returncode == 0, plan.stderr
        got = normalise(plan.stdout)
        # the lock's hashes, the cuDNN with Volta kernels, both plugin packages checked
        assert "--require-hashes -r @HPCSTACK_DATA@/recipes/jax/0.10.2-gpu.cuda12.lock" in got
        assert "checks the GPU architectures of jax-cuda12-pjrt" in got
        assert "checks the GPU architectures of jax-cuda12-plugin" in got
        assert "@HPCSTACK_DATA@/recipes/jax/jax-gpu-archs" in got and "install -m 0755" in got
    else:
        assert "module load jax/0.10.2-gpu" in got
        assert "/bin/jax-validate --backend mpi --device gpu" in got
        assert "hpcstack-train-benchmark" not in got and "MASTER_PORT" not in got


@pytest.mark.unit
def test_cirrus_v100_is_accepted_by_the_recorded_plugin_wheels():
    """cirrus's cc_list is [70]: the record says both plugin wheels carry SASS sm_70."""
    record = json.loads((RECIPE_DIR / "0.10.2-gpu.cuda12.gpu-archs.json").read_text())
    files = {rec["file"].split("-")[0]: rec for rec in record["wheels"].values()}
    assert set(files) == {"jax_cuda12_pjrt", "jax_cuda12_plugin"}
    assert all(70 in rec["sass"] and 80 in rec["sass"] for rec in files.values())
    proc = hpcstack("install", GPU, "--site", "cirrus", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "against compute capabilities 70" in proc.stdout
    assert "not recorded" not in proc.stdout + proc.stderr


@pytest.mark.unit
def test_cirrus_is_refused_where_the_record_starts_at_sm75(tmp_path):
    """The same recipe in a repository of its own whose record says what the CUDA 13 wheels
    carry (SASS from sm_75): the V100 site is refused before anything is written, one line per
    plugin package, naming the wheel and what it has."""
    repo = tmp_path / "repo" / "recipes" / "jax"
    shutil.copytree(RECIPE_DIR, repo)
    path = repo / "0.10.2-gpu.cuda12.gpu-archs.json"
    record = json.loads(path.read_text())
    for rec in record["wheels"].values():
        rec["sass"] = [a for a in rec["sass"] if a >= 75] + [75]
        for lib in rec["libraries"].values():
            lib["sass"] = [a for a in lib["sass"] if a >= 75] + [75]
    path.write_text(json.dumps(record))
    prefix = tmp_path / "sw"
    proc = hpcstack("install", GPU, "--site", "cirrus", "--repo", str(tmp_path / "repo"), "--prefix", str(prefix),
                    "--dry-run")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr
    lines = error_lines(proc.stderr)
    assert any("compute capability 7.0 is not supported by jax-cuda12-pjrt==0.10.2" in line for line in lines), lines
    assert any("compute capability 7.0 is not supported by jax-cuda12-plugin==0.10.2" in line for line in lines), lines
    assert "Traceback" not in proc.stderr and not prefix.exists()


@pytest.mark.unit
def test_a_cpu_site_is_refused_the_gpu_stack(tmp_path):
    repo = site_overlay(tmp_path / "repo")  # localhost, stating its Python: no module tool needed
    proc = hpcstack("install", GPU, "--site", "localhost", "--repo", str(repo), "--dry-run")
    assert proc.returncode == 2, proc.stderr
    assert error_lines(proc.stderr) == [
        "error: no lock file of this recipe fits site localhost: 0.10.2-gpu.cuda12.lock needs CUDA >= 12.1; "
        "the site has none"], proc.stderr


@pytest.mark.integration
def test_the_installed_plugins_architectures_are_read_without_a_gpu(tmp_path):
    """The sanity half of the check: the recipe's ``archs`` expression (jax-gpu-archs) in a venv
    holding the real jax-cuda12-plugin wheel of the lock (downloaded by its sha256, 8 MB,
    unpacked, not installed: its CUDA libraries stay out) names sm_70; the sanity snippet passes
    for cirrus's 7.0 and fails, naming the architectures, for a 3.0."""
    from hpcstack.install import gpuarch
    from hpcstack.install.components.cudawheels import _snippet
    from hpcstack.install.lockfile import read_lock
    from hpcstack.recipe import load_recipe
    from hpcstack.site import load_site

    recipe = load_recipe(GPU, load_site("cirrus"))
    comp = next(c for c in recipe.components if getattr(c, "package", "") == "jax-cuda12-plugin")
    pin = next(p for p in read_lock(str(RECIPE_DIR / "0.10.2-gpu.cuda12.lock")) if p.name == "jax-cuda12-plugin")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    try:
        wheel = gpuarch.download_wheel(pin, version, str(tmp_path))
    except Exception as exc:  # noqa: BLE001 - the reason is the skip's
        pytest.skip(f"PyPI not reachable: {exc}")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    import zipfile

    zipfile.ZipFile(wheel).extractall(purelib)
    for ccs, status in (((70, 80), 0), ((70, 30), 1)):
        code = "import os, sys\n" + _snippet(comp.archs, ccs, comp.package)
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=str(tmp_path))
        assert proc.returncode == status, proc.stdout + proc.stderr
        assert "sm_70" in proc.stdout and "compute_120" in proc.stdout, proc.stdout
    assert "do not run on compute capability 3.0" in proc.stderr


# ----------------------------------------------------------------------------- hpcstack lock


@pytest.mark.integration
def test_lock_prints_uvs_error_lines_and_names_min_python(tmp_path):
    """A recipe whose package needs Python >= 3.11 with PipWheels' default min_python (3.10):
    uv's lines, each an ``error:`` line (no Python list), and a hint naming min_python; found
    with hpcstack's own uv although PATH has none."""
    recipe = tmp_path / "repo" / "recipes" / "needs311"
    recipe.mkdir(parents=True)
    (recipe / "1.0.in").write_text("jax==0.10.2\n")
    (recipe / "1.0.py").write_text(
        "from hpcstack.install.components import Modulefile, PipWheels, Venv\n"
        "from hpcstack.recipe import Recipe\n\n\n"
        "def recipe(site):\n"
        "    return Recipe('needs311', '1.0', whatis='needs Python 3.11', components=[Venv(), PipWheels('1.0'), Modulefile()])\n")
    assert shutil.which("uv", path="/usr/bin:/bin") is None
    proc = hpcstack("lock", "needs311/1.0", "--site", "localhost", "--repo", str(tmp_path / "repo"),
                    env={"PATH": "/usr/bin:/bin"}, timeout=300)
    if "Failed to fetch" in proc.stderr or "error sending request" in proc.stderr:
        pytest.skip(f"PyPI not reachable: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = error_lines(proc.stderr)
    assert lines and len(lines) == len(proc.stderr.strip().splitlines()), proc.stderr
    assert lines[0] == "error: uv pip compile failed for 1.0.pypi.lock:"
    assert "uv not found" not in proc.stderr and "['" not in proc.stderr
    assert any("requires-python" in line and "jax==0.10.2" in line for line in lines), lines
    assert "min_python" in lines[-1] and "PipWheels('1.0', min_python=\"3.11\")" in lines[-1], lines[-1]
    assert not (recipe / "1.0.pypi.lock").exists()


# ----------------------------------------------------------------------------- CPU: install and validate


@pytest.fixture(scope="module")
def installed(localhost_ready):
    """jax/0.10.2-cpu installed for the localhost site (Environment Modules) into a temporary
    prefix, with the machine's caches (/var/cache/hpcstack: the wheels are downloaded once per
    machine): (root, process, install args). Readable by all: the Slurm jobs run as the site's
    submit user."""
    root = Path(tempfile.mkdtemp(prefix="hpcstack-jax-", dir="/var/tmp"))
    root.chmod(0o755)
    args = ["--site", "localhost", "--prefix", str(root / "sw"), "--module-root", str(root / "mf")]
    proc = hpcstack("install", CPU, *args, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    yield root, proc, args
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.integration
def test_module_load_gives_jax_and_the_validation_program(installed):
    require(ENVIRONMENT_MODULES)
    root, proc, _ = installed
    assert "sanitycheck" in proc.stderr, proc.stderr[-2000:]
    shell = ENVIRONMENT_MODULES.bash(
        "module load jax/0.10.2-cpu || exit 1\n"
        "python -c 'import jax; print(jax.__version__, jax.__file__, jax.devices()[0].platform)'\n"
        "command -v jax-validate extend-venv-activate",
        modulepath=f"{root / 'mf'}:/opt/hpcstack/base-modulefiles")
    assert shell.returncode == 0, shell.stderr
    version, path, platform = shell.stdout.splitlines()[0].split()
    assert (version, platform) == ("0.10.2", "cpu")
    assert os.path.realpath(path).startswith(os.path.realpath(root / "sw" / "jax"))
    assert shell.stdout.splitlines()[1] == str(root / "sw" / "jax" / "0.10.2-cpu" / "bin" / "jax-validate")


@pytest.mark.integration
def test_local_validation_on_two_ranks_passes(installed):
    _, _, args = installed
    proc = hpcstack("validate", CPU, *args, "--local", "--ranks", "2", timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    checks = re.search(r"^collectives: (\d+) checks \(8 ops x 4 dtypes x 5 sizes\) in [\d.]+ s: PASS$", out, re.M)
    assert checks and int(checks.group(1)) >= 140, out
    loss = re.search(r"^loss ([\d.]+) -> ([\d.]+) \(threshold 0.2\); parameters identical on all ranks: True$", out, re.M)
    assert loss and float(loss.group(2)) < min(0.2, float(loss.group(1))), out
    assert "start-up over 2 rank(s)" in out and "psum MB/s:" in out
    assert out.rstrip().endswith("PASS")
    print(out)


@pytest.mark.integration
def test_the_corrupted_workload_fails(installed):
    """The negative control: one wrong psum element on the last rank, and that rank's
    parameters drifting for one step; both are named, the run fails with exit status 1."""
    _, _, args = installed
    proc = hpcstack("validate", CPU, *args, "--local", "--ranks", "2", "--workload", "corrupted", timeout=900)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    fail = next((line for line in proc.stderr.splitlines() if line.startswith("FAIL: ")), "")
    assert "collectives check failed: psum float32 x 4913: rank 1: 1 wrong element(s), first at [4912]" in fail, fail
    assert "parameters differ between ranks after training" in fail, fail
    assert "--corrupt-collective --corrupt-training" in proc.stderr
    assert "PASS" not in proc.stdout.splitlines()[-1:]


@pytest.mark.integration
def test_slurm_validation_on_one_and_two_nodes(installed):
    _, _, args = installed
    with two_node_cluster():
        for out in user_writable_dir("hpcstack-test", "hpcstack-jax-"):
            proc = hpcstack("validate", CPU, *args, "--nodes", "1,2", "--output-dir", str(out / "v"), "--json",
                            timeout=1800)
            report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            runs = {r["nodes"]: r for r in report["runs"]}
            assert set(runs) == {1, 2} and all(r["backend"] == "mpi" for r in runs.values())
            for r in runs.values():
                assert r["ok"], r
                assert r["collectives"]["ran"] and r["collectives"]["ok"], r["collectives"]
                assert r["figures"]["samples_per_sec"]["value"] > 0
                assert r["startup"]["ranks"] == r["ranks"]
            assert runs[2]["transport"] == "gloo"
            assert runs[2]["figures"]["allreduce_bandwidth"]["ok"] is True
            print(json.dumps({n: {name: f["value"] for name, f in r["figures"].items()} for n, r in runs.items()}))
